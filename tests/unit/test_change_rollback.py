"""A failed change's rollback on an OCS that undoes an unconfirmed change by itself (NETCONF's confirmed commit):
what the rollback puts back must itself be confirmed, or the switch would undo the rollback after its timeout and
refuse the next change. Pure logic: a driver with confirmed-commit semantics, no network."""
from __future__ import annotations

from controller.core.circuits import CircuitMap
from controller.devices.changes import CircuitChanges, pairs
from tests.unit.test_apps import RACK, REGROUPED


class ConfirmedCommitOcs:
    """Holds `held`; `apply` commits with a rollback timer (pending) until `confirm`; `cancel` undoes a pending one."""
    connected = True

    def __init__(self, held):
        self.held, self.before, self.pending = set(held), None, False

    def read(self):
        return set(self.held)

    def apply(self, remove, add, on_dark=None):
        assert not self.pending, "a change refused: the last one is not confirmed yet"
        self.before, self.pending = set(self.held), True
        self.held = (self.held - remove) | add

    def confirm(self):
        self.pending = False

    def cancel(self):
        if not self.pending:
            return False
        self.held, self.pending = self.before, False
        return True

    def timeout(self):  # the switch's own rollback of an unconfirmed change
        if self.pending:
            self.held, self.pending = self.before, False


class State:
    def __init__(self, circuits):
        self.circuits = circuits

    def save(self):
        pass


class Fabric:
    def sync_quietly(self):
        pass


def test_a_rollback_on_an_ocs_that_had_confirmed_the_change_is_itself_confirmed():
    """One OCS confirmed the new circuits before another's confirm failed: rolling it back is a new change, which
    must be confirmed, so that the switch's timer does not bring the failed change back."""
    before, after = CircuitMap.initial(RACK), CircuitMap.parse(RACK, REGROUPED)
    ocs = ConfirmedCommitOcs(pairs(before.on("ocs1")))
    ocs.apply(pairs(before.on("ocs1")) - pairs(after.on("ocs1")), pairs(after.on("ocs1")) - pairs(before.on("ocs1")))
    ocs.confirm()
    resync = []
    changes = CircuitChanges(State(after), {"ocs1": ocs}, Fabric(), None, resync.append)
    changes._roll_back(before, ["ocs1"])
    ocs.timeout()
    assert ocs.read() == pairs(before.on("ocs1")) and not ocs.pending and resync == []


def test_a_rollback_of_an_unconfirmed_change_is_the_switchs_own():
    before, after = CircuitMap.initial(RACK), CircuitMap.parse(RACK, REGROUPED)
    ocs = ConfirmedCommitOcs(pairs(before.on("ocs1")))
    ocs.apply(pairs(before.on("ocs1")) - pairs(after.on("ocs1")), pairs(after.on("ocs1")) - pairs(before.on("ocs1")))
    changes = CircuitChanges(State(after), {"ocs1": ocs}, Fabric(), None, [].append)
    changes._roll_back(before, ["ocs1"])
    assert ocs.read() == pairs(before.on("ocs1")) and not ocs.pending and ocs.before == pairs(before.on("ocs1"))
