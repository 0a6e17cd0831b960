"""Marks every test under tests/integration `integration`, and runs the tests that share the
emulated testbed before those that bring up a rack of their own, so it is built once."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]  # tests/integration/test_isolation.py runs an inner pytest session

INTEGRATION = Path(__file__).resolve().parent / "integration"


def _integration(item) -> bool:
    return INTEGRATION in Path(item.path).resolve().parents


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _integration(item):
            item.add_marker(pytest.mark.integration)
    # Stable: unit tests, then integration tests on the shared testbed, then the rest.
    items.sort(key=lambda item: 0 if not _integration(item) else 1 if "testbed" in item.fixturenames else 2)
