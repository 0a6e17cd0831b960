#!/bin/bash
# The simulator without root: a plain virtualenv (no system packages), `pip install` of the project's base (no
# extras), then `optirack simulate` and `optirack sweep` from a directory outside the source, the bundled rack file
# and trace found by name. Run by tests/install/test_install.py as a user without root. Argument: a work folder
# holding src/ (a copy of the project); everything it makes is under that folder.
set -euo pipefail
WORK=$1
cd "$WORK"
echo "uid $(id -u)"
[ "$(id -u)" != 0 ] || { echo "running as root: this check is for a user without root" >&2; exit 1; }
export HOME=$WORK/home PIP_CACHE_DIR=$WORK/pip-cache
mkdir -p "$HOME" run
# As the README says it: a virtualenv made inside a clone (a git work tree, where the venv is untracked), the
# project installed from it. No --system-site-packages: nothing of Debian's.
git -C src init -q && git -C src add -A
python3 -m venv src/venv
ln -s src/venv venv
venv/bin/pip install -q --disable-pip-version-check ./src
! venv/bin/python -c "import ryu" 2>/dev/null || { echo "ryu was installed by the base install" >&2; exit 1; }
! venv/bin/python -c "import docker" 2>/dev/null || { echo "docker was installed by the base install" >&2; exit 1; }
cd run  # not the source: the bundled files must be found by name
../venv/bin/optirack simulate --rack paper-testbed --case a --quiet --no-plots --out sim-a
../venv/bin/optirack simulate --gpus 32 --gpus-per-switch 8 --gpus-per-server 4 --oversubscription 8 --spare 1 \
    --models V100 --trace sample.csv --policies regroup,timeshift --quiet --out sim-trace
../venv/bin/optirack sweep --gpus 16 --gpus-per-switch 8 --jobs 10 --policies fixed --schedulers fifo --loads 0.5 \
    --seeds 2 --workers 1 --out sweep
../venv/bin/python - <<'PY'
import sys
from simulator.cli import main as cli
from simulator.studies import sweep  # noqa: F401
import controller.cli  # noqa: F401  (the `optirack` command itself)
loaded = {"ryu", "eventlet", "docker", "mininet"} & {m.split(".")[0] for m in sys.modules}
assert not loaded, f"the simulator imported {loaded}"
PY
ls sim-a/summary.md sim-trace/summary.md sim-trace/overview.png sweep/study.md
# the installed copy knows its model (simulator/fingerprint.json) and the records' (<record>.fingerprint)
grep -q "made with the simulator's current model" sim-a/summary.md || { echo "--case a: its record's model unknown" >&2; exit 1; }
echo "install check: passed"
