"""emulation/harness.py's testbed under SIGTERM: a process that brought the rack up ends by SystemExit, so that its
testbed's __exit__ takes the rack and the controller down (by default SIGTERM ends Python at once and leaves them)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from emulation import harness


@pytest.fixture
def default_sigterm():
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, before)


def test_sigterm_raises_system_exit_once_a_testbed_is_up_and_the_handler_before_is_given_back(default_sigterm):
    before = harness._exit_on_sigterm()
    assert before is signal.SIG_DFL
    with pytest.raises(SystemExit) as e:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode: never reached
    assert e.value.code == 128 + signal.SIGTERM


def test_a_handler_already_in_place_is_left_alone(default_sigterm):
    def mine(_sig, _frame):
        pass

    signal.signal(signal.SIGTERM, mine)
    assert harness._exit_on_sigterm() is None
    assert signal.getsignal(signal.SIGTERM) is mine
