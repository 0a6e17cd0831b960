#!/usr/bin/env bash
# make test: the unit tests run beside the integration tests, which spend most of their time
# waiting on containers and the emulated network; the unit tests' report follows the
# integration tests' report, and the exit status fails if either part failed.
# Arguments go to both pytest runs (e.g. -v --durations=15).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
unit_dir=$(mktemp -d -t optirack-unit-tests.XXXXXX)  # its own log and pytest temp folder
unit_log=$unit_dir/report.txt
"$PY" -m pytest -m "not integration" tests -p no:cacheprovider --basetemp "$unit_dir/tmp" "$@" >"$unit_log" 2>&1 &
unit_pid=$!
stop_unit() { kill "$unit_pid" 2>/dev/null; wait "$unit_pid" 2>/dev/null; rm -rf "$unit_dir"; }
trap stop_unit EXIT
trap 'exit 130' INT TERM
echo "==> unit tests: running in the background (their report follows the integration tests')"
echo "==> integration tests"
"$PY" -m pytest -m integration tests "$@"
integration=$?
wait "$unit_pid"
unit=$?
# 5: the arguments selected no test of that part (say -k naming a unit test only)
[ "$integration" -eq 5 ] && integration=0
[ "$unit" -eq 5 ] && unit=0
echo
echo "==> unit tests (ran beside the integration tests)"
cat "$unit_log"
echo
echo "==> integration tests: exit $integration; unit tests: exit $unit"
[ "$integration" -eq 0 ] && [ "$unit" -eq 0 ]
