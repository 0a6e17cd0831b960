#!/usr/bin/env bash
# Build the worker image (base by debootstrap + docker import, worker by docker build) if its
# inputs changed. Options: --check (build nothing, exit 1 if stale), --force.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$ROOT/build"
exec "${VENV:-$ROOT/.venv}/bin/python" -m containers.image "$@"
