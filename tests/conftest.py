"""Marks every test under tests/integration `integration`, and runs the tests that share the
emulated testbed before those that bring up a rack of their own, so it is built once; the longest unit modules first.

It also parses each rack file's text once per test process: the trace check's simulations (tracesim, run by
make report's check, the trace records' and the fingerprint's tests) load the same rack file for each of their 64
draws, and PyYAML's pure-Python parser was three quarters of their time (_memo_rack_yaml)."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import yaml

from controller.core import rack as _rack_module

pytest_plugins = ["pytester"]  # tests/integration/test_isolation.py runs an inner pytest session

INTEGRATION = Path(__file__).resolve().parent / "integration"


class _MemoYaml:
    """controller/core/rack.py's `yaml`, with `safe_load` of a text parsed once: a pure function of the text, so the
    same text gives the same data; each call gets its own copy (unpickled), so no caller sees another's changes. A
    text that does not parse is not kept (each call raises as PyYAML does). Everything else is PyYAML's own."""

    def __init__(self) -> None:
        self._parsed: dict[str, bytes] = {}

    def __getattr__(self, name: str):
        return getattr(yaml, name)

    def safe_load(self, stream):
        if not isinstance(stream, str):
            return yaml.safe_load(stream)
        kept = self._parsed.get(stream)
        if kept is None:
            data = yaml.safe_load(stream)
            if len(self._parsed) >= 256:  # tests that write many rack files: keep memory bounded
                self._parsed.clear()
            kept = self._parsed[stream] = pickle.dumps(data, pickle.HIGHEST_PROTOCOL)
        return pickle.loads(kept)


def _memo_rack_yaml() -> None:
    if not isinstance(_rack_module.yaml, _MemoYaml):
        _rack_module.yaml = _MemoYaml()


_memo_rack_yaml()


def _integration(item) -> bool:
    return INTEGRATION in Path(item.path).resolve().parents


# The unit modules that take longest (make test's --durations), first: make test hands whole modules to its xdist
# workers (--dist loadfile) in this order, so that none of these starts last while the other worker idles. An order
# only: every test runs as before.
LONGEST_FIRST = ("test_fingerprint.py", "test_report.py", "test_docs_commands.py", "test_sim_traces.py",
                 "test_worker.py", "test_worker_aggregate.py", "test_sim_speed.py", "test_worker_regroup.py",
                 "test_trace_records.py", "test_report_trace.py", "test_tracecheck.py", "test_aggregation.py",
                 "test_fault_matrix.py")


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
