"""Marks every test under tests/integration `integration`, and runs the tests that share the
emulated testbed before those that bring up a rack of their own, so it is built once; the longest unit modules first.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # tests/integration/test_isolation.py runs an inner pytest session

INTEGRATION = Path(__file__).resolve().parent / "integration"


def _integration(item) -> bool:
    return INTEGRATION in Path(item.path).resolve().parents


# The unit modules that take longest (make test's --durations; the install test, which make test runs with them), first:
# make test hands whole modules to its xdist workers (--dist loadfile) in this order, so that none of these starts last
# while the other worker idles. An order only: every test runs as before.
LONGEST_FIRST = ("test_install.py", "test_fingerprint.py", "test_report.py", "test_docs_commands.py",
                 "test_sim_traces.py", "test_worker.py", "test_worker_aggregate.py", "test_sim_speed.py",
                 "test_worker_regroup.py", "test_trace_records.py", "test_report_trace.py", "test_tracecheck.py",
                 "test_aggregation.py", "test_fault_matrix.py")


def _order(item) -> tuple[int, int]:
    if not _integration(item):
        name = Path(item.path).name
        return 0, LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)
    return (1 if "testbed" in item.fixturenames else 2), 0


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _integration(item):
            item.add_marker(pytest.mark.integration)
    # Stable: unit tests (the longest modules first), then integration tests on the shared testbed, then the rest.
    items.sort(key=_order)
