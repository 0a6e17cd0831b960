"""The emulated NETCONF OCS's agent, its pure logic: which pairs a netconfd notification names, and which flow
commands it sends (ovs-ofctl recorded, not run); the real agent on a bridge is tests/integration/test_netconf.py's."""
from __future__ import annotations

import pytest

from emulation.netconf_agent import COOKIE, Agent, changed_ingress

# what netconfd (Debian's yuma123 2.13) sends after an edit-config of two pairs and a commit (trimmed)
CHANGE = """<?xml version="1.0" encoding="UTF-8"?>
<notification xmlns="urn:ietf:params:xml:ns:netconf:notification:1.0">
  <eventTime>2026-11-29T00:57:54Z</eventTime>
  <netconf-config-change xmlns="urn:ietf:params:xml:ns:yang:ietf-netconf-notifications">
    <changed-by><username>optirack</username><session-id>2</session-id></changed-by>
    <edit>
      <target
        xmlns:ocs="urn:optirack:yang:optirack-ocs">/ocs:cross-connects/ocs:pair[ocs:ingress='1']</target>
      <operation>replace</operation>
    </edit>
    <edit>
      <target xmlns:ocs="urn:optirack:yang:optirack-ocs">/ocs:cross-connects/ocs:pair[ocs:ingress='12']</target>
      <operation>delete</operation>
    </edit>
  </netconf-config-change>
</notification>"""


def test_a_change_notification_names_its_pairs_ingress_ports():
    assert changed_ingress(CHANGE) == {1, 12}
    # a pair that kept its ingress and got a new egress (the driver merges it): the edit names the pair's egress
    merged = CHANGE.replace("ocs:pair[ocs:ingress='1']<", "ocs:pair[ocs:ingress='7']/ocs:egress<")
    assert changed_ingress(merged) == {7, 12}


@pytest.mark.parametrize("text", [
    CHANGE.replace("/ocs:pair[ocs:ingress='12']", ""),  # the whole container: only the datastore says what changed
    CHANGE.replace("<edit>", "<x>").replace("</edit>", "</x>").replace("target", "y"),  # no edits named
    "<notification",  # not XML
])
def test_a_notification_that_names_no_pairs_has_the_datastore_read(text):
    assert changed_ingress(text) is None


class Recording(Agent):
    def __init__(self, held):
        super().__init__(0, "ocs1", switching_ms=0)
        self.held, self.sent = set(held), []

    def _ofctl(self, *args, stdin=None):
        self.sent.append((args, stdin))
        return ""


def test_the_named_pairs_go_dark_at_once_and_the_rest_follows_the_datastore():
    agent = Recording({(1, 11), (2, 12), (3, 13)})
    ports, _ = agent.darken({1, 12})  # 12 is the egress of the pair at ingress 2
    assert ports == {1, 11, 2, 12}
    (args, stdin), = agent.sent
    assert "delete_strict" in stdin and {int(x.split("in_port=")[1]) for x in stdin.splitlines()} == ports
    assert agent.held == {(3, 13)}
    agent.sent.clear()
    agent.make({(1, 12), (3, 13)}, dark=frozenset(ports))  # what the datastore then holds
    (args, stdin), = agent.sent  # nothing more to make dark: only the new pair's flows
    assert "actions=output:12" in stdin and "actions=output:1" in stdin and "delete" not in stdin
    assert agent.held == {(1, 12), (3, 13)}


def test_a_change_of_every_circuit_goes_dark_by_one_deletion():
    agent = Recording({(1, 11), (2, 12)})
    agent.darken({1, 2})
    assert agent.sent == [(("del-flows", "ocs1", f"cookie={COOKIE}"), None)]
