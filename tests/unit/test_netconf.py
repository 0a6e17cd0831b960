"""The NETCONF driver against canned replies: a loopback server that speaks NETCONF 1.0 framing (after yuma123's
<ncx-connect>) and answers each RPC from a script, so that the driver's own parsing and ncclient's run for real.
The real netconfd is in tests/integration/test_netconf.py; the model's validation with pyang is here."""
from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from controller.core.errors import DeviceError, OcsUnavailable
from controller.core.rack import Ocs
from controller.drivers.errors import NetconfError
from controller.drivers.netconf import YANG, NetconfOcs, edit_config, parse_pairs
from controller.drivers.netconf_transport import Address, parse_address

NS = "urn:optirack:yang:optirack-ocs"
DELIM = b"]]>]]>"
OK = "<ok/>"


class AfterNext(str):
    """A reply the canned server sends only once the RPC after it has come (it answers both, in order): a client
    that waits for this reply before sending its next RPC never gets it."""


def data(*pairs) -> str:
    body = "".join(f"<pair><ingress>{a}</ingress><egress>{b}</egress></pair>" for a, b in pairs)
    return f'<data><cross-connects xmlns="{NS}">{body}</cross-connects></data>'


def rpc_error(tag: str, message: str, path: str = "") -> str:
    return (f"<rpc-error><error-type>application</error-type><error-tag>{tag}</error-tag>"
            f"<error-severity>error</error-severity>{f'<error-path>{path}</error-path>' if path else ''}"
            f"<error-message>{message}</error-message></rpc-error>")


class CannedServer:
    """Answers RPCs by operation name: `script[op]` is a list of replies used in turn (the last one repeats);
    a reply is the body of <rpc-reply>, or "DROP" (close the connection), or raw bytes sent as they are."""

    def __init__(self, script: dict[str, list], capabilities: tuple[str, ...] = ()):
        self.script, self.seen, self.texts, self.capabilities = script, [], [], capabilities
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.threads[0].start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.threads.append(threading.Thread(target=self._session, args=(conn,), daemon=True))
            self.threads[-1].start()

    def _session(self, conn):
        try:
            self._converse(conn)
        except OSError:  # the test closed the connection (close()) or the driver dropped it
            return

    def _converse(self, conn):
        buf, held = b"", None
        hello = ('<hello xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><capabilities><capability>'
                 'urn:ietf:params:netconf:base:1.0</capability><capability>urn:ietf:params:netconf:capability:'
                 'candidate:1.0</capability>' + "".join(f"<capability>{c}</capability>" for c in self.capabilities)
                 + '</capabilities><session-id>7</session-id></hello>')
        conn.sendall(hello.encode() + DELIM)
        while True:
            while DELIM not in buf:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buf += chunk
            msg, buf = buf.split(DELIM, 1)
            text = msg.decode()
            rpc = re.search(r'<(?:\w+:)?rpc\b[^>]*message-id="([^"]+)"[^>]*>\s*<(?:\w+:)?([\w-]+)', text)
            if rpc is None:
                continue  # ncx-connect, hello
            mid, op = rpc.groups()
            self.seen.append(op)
            self.texts.append(text)
            replies = self.script.get(op, [OK])
            reply = replies.pop(0) if len(replies) > 1 else replies[0]
            if held is not None:
                conn.sendall(held)
                held = None
            if isinstance(reply, AfterNext):
                held = (f'<rpc-reply xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="{mid}">{reply}'
                        f"</rpc-reply>").encode() + DELIM
                continue
            if reply == "DROP":
                conn.close()
                return
            if isinstance(reply, bytes):
                conn.sendall(reply + DELIM)
                continue
            conn.sendall(f'<rpc-reply xmlns="urn:ietf:params:xml:ns:netconf:base:1.0" message-id="{mid}">{reply}'
                         f"</rpc-reply>".encode() + DELIM)

    def close(self):
        """Stop accepting, end every session (a shutdown wakes a thread blocked in accept or recv, so none is left
        reading a descriptor that a later test reuses), wait for the threads, then close the sockets."""
        for s in (self.sock, *self.conns):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected, or already closed by a DROP
        for t in self.threads:
            t.join(timeout=5)
        for s in (self.sock, *self.conns):
            s.close()


@pytest.fixture
def canned():
    servers = []

    def make(script, capabilities=()):
        servers.append(CannedServer(script, capabilities))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def driver(port: int, timeout: float = 5.0) -> NetconfOcs:
    spec = Ocs(name="ocs1", ports=32, dpid=1, switching_time_ms=5, driver="netconf",
               address=f"tcp-ncx://127.0.0.1:{port}")
    return NetconfOcs(spec, "optirack", "", timeout=timeout)


def test_a_change_is_one_locked_edit_and_commit_and_is_read_back(canned):
    server = canned({"get-config": [data((1, 11)), data((1, 12), (2, 13))]})
    d = driver(server.port)
    assert d.read() == {(1, 11)} and d.connected
    result = d.apply({(1, 11)}, {(1, 12), (2, 13)})
    assert server.seen == ["get-config", "lock", "edit-config", "commit", "unlock", "get-config"]
    assert result.switching_time_s == 0.005 and result.dark_start <= result.dark_end
    assert "test-option" not in server.texts[2]  # a device without :validate gets none


def test_a_device_with_validate_checks_the_whole_datastore_only_at_the_commit(canned):
    """With :validate, the edit-config asks test-option "set": the device checks each edited pair then, and the
    whole candidate once, at the commit (a device's whole check costs it the square of its pairs)."""
    server = canned({"get-config": [data((1, 12))]}, ("urn:ietf:params:netconf:capability:validate:1.1",))
    driver(server.port).apply({(1, 11)}, {(1, 12)})
    assert server.seen == ["lock", "edit-config", "commit", "unlock", "get-config"]
    assert "<nc:test-option>set</nc:test-option>" in server.texts[1]


CONFIRMED = ("urn:ietf:params:netconf:capability:confirmed-commit:1.0",
             "urn:ietf:params:netconf:capability:confirmed-commit:1.1")


def test_with_confirmed_commit_a_change_is_kept_only_by_its_confirm(canned):
    """The RPCs of one change: lock, edit-config, a confirmed commit with its timeout, get-config, and once the
    caller confirms, the confirming commit and the unlock: no others."""
    server = canned({"get-config": [data((1, 12), (2, 13))]}, CONFIRMED)
    d = driver(server.port)
    d.confirm_timeout = 7
    d.apply({(1, 11)}, {(1, 12), (2, 13)})
    assert server.seen == ["lock", "edit-config", "commit", "get-config"]  # the candidate stays locked
    assert "<nc:confirmed/><nc:confirm-timeout>7</nc:confirm-timeout>" in server.texts[2]
    d.confirm()
    assert server.seen == ["lock", "edit-config", "commit", "get-config", "commit", "unlock"]
    assert "confirmed" not in server.texts[4]
    assert set(d.rpc_ms) == {"lock", "edit-config", "commit", "get-config", "confirm", "unlock", "switching-wait",
                             "total"}
    d.confirm()  # nothing waits: nothing sent
    assert len(server.seen) == 6


def test_the_confirm_and_the_unlock_go_back_to_back(canned):
    """The unlock is sent without waiting for the confirm's reply (the server answers the confirm only once the
    unlock has come: a driver that waited would time out); a refused confirm still unlocks, and says so."""
    server = canned({"commit": [OK, AfterNext(OK)], "get-config": [data((1, 12))]}, CONFIRMED)
    d = driver(server.port, timeout=2)
    d.apply(set(), {(1, 12)})
    d.confirm()
    assert server.seen[-2:] == ["commit", "unlock"] and d.connected and d.rpc_ms["confirm"] > 0
    refused = rpc_error("operation-failed", "cannot save the startup file")
    server = canned({"commit": [OK, AfterNext(refused)], "get-config": [data((1, 12))]}, CONFIRMED)
    d = driver(server.port, timeout=2)
    d.apply(set(), {(1, 12)})
    with pytest.raises(NetconfError, match=r"confirming commit \(ports 1, 12 refused: operation-failed: cannot save"):
        d.confirm()
    assert server.seen[-2:] == ["commit", "unlock"] and d.connected and "unlock" in d.rpc_ms


def test_the_read_back_goes_right_behind_the_confirmed_commit(canned):
    """The get-config is sent without waiting for the confirmed commit's reply (the server answers the commit only
    once the get-config has come: a driver that waited would time out); a refused commit still discards the candidate
    and unlocks, its read-back's reply left unread."""
    server = canned({"commit": [AfterNext(OK), OK], "get-config": [data((1, 12))]}, CONFIRMED)
    d = driver(server.port, timeout=2)
    d.apply(set(), {(1, 12)})
    assert server.seen == ["lock", "edit-config", "commit", "get-config"] and d.rpc_ms["get-config"] >= 0
    d.confirm()
    refused = rpc_error("operation-failed", "egress port in use",
                        "/ocs:cross-connects/ocs:pair[ocs:ingress='2']/ocs:egress")
    server = canned({"commit": [AfterNext(refused)], "get-config": [data((1, 11))]}, CONFIRMED)
    d = driver(server.port, timeout=2)
    with pytest.raises(NetconfError, match=r"confirmed commit \(port 2 refused: operation-failed: egress port in use"):
        d.apply(set(), {(2, 13)})
    assert server.seen == ["lock", "edit-config", "commit", "get-config", "discard-changes", "unlock"]
    assert d.read() == {(1, 11)} and d.connected


def test_a_read_back_that_differs_cancels_the_confirmed_commit(canned):
    server = canned({"get-config": [data((1, 11))]}, CONFIRMED)  # the device still holds the old pair
    d = driver(server.port)
    with pytest.raises(NetconfError, match=r"other cross-connects at ports 1, 11, 12 than were committed"):
        d.apply({(1, 11)}, {(1, 12)})
    assert server.seen == ["lock", "edit-config", "commit", "get-config", "cancel-commit", "unlock"]
    assert not d.cancel()  # nothing left to undo


def test_a_failed_change_elsewhere_cancels_an_unconfirmed_one(canned):
    server = canned({"get-config": [data((4, 5))]}, CONFIRMED)
    d = driver(server.port)
    d.apply(set(), {(4, 5)})
    with pytest.raises(NetconfError, match="not confirmed yet"):
        d.apply(set(), {(6, 7)})  # one change at a time
    assert d.cancel() and server.seen[-2:] == ["cancel-commit", "unlock"]


def test_a_refused_commit_names_the_port_and_discards_the_candidate(canned):
    refused = rpc_error("operation-failed", "egress port in use",
                        "/ocs:cross-connects/ocs:pair[ocs:ingress='2']/ocs:egress")
    server = canned({"commit": [refused], "get-config": [data((1, 11))]})
    d = driver(server.port)
    with pytest.raises(NetconfError, match=r"commit \(port 2 refused: operation-failed: egress port in use\)"):
        d.apply(set(), {(2, 13)})
    assert server.seen == ["lock", "edit-config", "commit", "discard-changes", "unlock"]
    assert d.read() == {(1, 11)} and d.connected  # the session stays; the device kept what it had


def test_a_held_lock_is_refused_before_anything_is_sent(canned):
    server = canned({"lock": [rpc_error("lock-denied", "lock held by session 3")]})
    d = driver(server.port)
    with pytest.raises(NetconfError, match=r"lock of the candidate datastore \(ports 4, 5 refused: lock-denied: "
                                           r"the candidate datastore is locked by another session"):
        d.apply(set(), {(4, 5)})
    assert "edit-config" not in server.seen and "commit" not in server.seen


def test_a_malformed_reply_drops_the_session_and_says_what(canned):
    server = canned({"get-config": [f'<data><cross-connects xmlns="{NS}"><pair><ingress>x</ingress></pair>'
                                    "</cross-connects></data>"]})
    d = driver(server.port)
    with pytest.raises(OcsUnavailable, match=r"malformed reply to get-config \(every port\): a pair without port"):
        d.read()
    assert not d.connected and "malformed" in d.status()["error"]


def test_a_reply_that_is_not_xml_is_a_malformed_reply(canned):
    server = canned({"commit": [b"<rpc-reply message-id='x'><ok/>"]})  # cut short: never parses
    d = driver(server.port, timeout=1.0)
    with pytest.raises(OcsUnavailable, match=r"commit \(ports 3, 9\)"):
        d.apply(set(), {(3, 9)})
    assert not d.connected


def test_a_dropped_session_mid_change_is_unavailable_naming_the_operation(canned):
    server = canned({"commit": ["DROP"]})
    d = driver(server.port)
    with pytest.raises(OcsUnavailable, match=r"during commit \(ports 6, 7\)|commit \(ports 6, 7\)"):
        d.apply(set(), {(6, 7)})
    assert not d.connected and d.status()["error"]


def test_no_device_is_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(OcsUnavailable, match="cannot reach NETCONF"):
        driver(port).read()


def test_errors_are_device_errors():
    assert issubclass(NetconfError, DeviceError) and issubclass(OcsUnavailable, DeviceError)


def test_edit_config_deletes_creates_and_replaces_in_place():
    xml = edit_config({(1, 11), (2, 12)}, {(2, 13), (4, 5)})
    assert '<pair nc:operation="delete"><ingress>1</ingress></pair>' in xml
    assert '<pair><ingress>2</ingress><egress>13</egress></pair>' in xml  # merged into the entry: a new egress
    assert '<pair nc:operation="create"><ingress>4</ingress><egress>5</egress></pair>' in xml
    assert xml.count("<ingress>2</ingress>") == 1  # replaced in place, not deleted as well


@pytest.mark.parametrize("text, error", [
    ("<data", "not XML"),
    (f'<data><cross-connects xmlns="{NS}"><pair><ingress>3</ingress><egress>3</egress></pair>'
     "</cross-connects></data>", "impossible ports"),
])
def test_parse_pairs_refuses_what_is_not_cross_connects(text, error):
    with pytest.raises(DeviceError, match=error):
        parse_pairs(text)


def test_parse_pairs_reads_pairs_in_either_order():
    assert parse_pairs(data((11, 1), (2, 13))) == {(1, 11), (2, 13)}


@pytest.mark.parametrize("address, expected", [
    ("ocs.lab", Address("ssh", "ocs.lab", 830)),
    ("ssh://ocs.lab:2830", Address("ssh", "ocs.lab", 2830)),
    ("ssh://admin@ocs.lab?known_hosts=/etc/optirack/known_hosts&keyfile=/etc/optirack/id",
     Address("ssh", "ocs.lab", 830, "admin", "/etc/optirack/known_hosts", "/etc/optirack/id")),
    ("tcp-ncx://127.0.0.1:8830", Address("tcp-ncx", "127.0.0.1", 8830)),
])
def test_addresses(address, expected):
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["", "telnet://x:1", "tcp-ncx://127.0.0.1", "ssh://host:port", "ssh://h?x=1",
                                     "ssh://h?known_hosts=relative", "tcp-ncx://u@h:1", "tcp-ncx://h:1?keyfile=/k"])
def test_bad_addresses_say_what_is_wrong(address):
    with pytest.raises(ValueError, match="NETCONF"):
        parse_address(address)


def test_the_yang_model_validates_with_pyang():
    pyang = shutil.which("pyang", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert pyang, "pyang is a dev dependency (setup.cfg): make setup installs it"
    out = subprocess.run([pyang, "--strict", "-f", "tree", str(YANG)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "+--rw pair* [ingress]" in out.stdout and "+--rw egress     port-id" in out.stdout


def test_a_read_back_of_many_ports_reads_the_whole_container_and_picks_the_changed_ones():
    """More changed ports than BY_KEY_MOST: no filter by key (netconfd's cost grows with keys times pairs); the pairs
    at other ports that the whole container holds are not the change's."""
    from controller.drivers.netconf import BY_KEY_MOST

    add = {(i, 100 + i) for i in range(1, BY_KEY_MOST + 2)}
    server = CannedServer({"get-config": [data(*add, (90, 91))]})
    try:
        d = driver(server.port)
        d.apply(set(), add)
        assert "<ingress>" not in server.texts[-1]  # the whole container
        small = CannedServer({"get-config": [data((1, 2))]})
        try:
            driver(small.port).apply(set(), {(1, 2)})
            assert "<ingress>1</ingress>" in small.texts[-1]  # by key
        finally:
            small.close()
    finally:
        server.close()


def test_a_pipelined_read_back_lost_or_malformed_leaves_nothing_to_confirm(canned):
    """The read-back sent right behind the confirmed commit: a malformed one, or a session lost at the commit, drops
    the session (the device undoes an unconfirmed commit by itself) and leaves nothing to confirm or cancel."""
    bad = f'<data><cross-connects xmlns="{NS}"><pair><ingress>x</ingress></pair></cross-connects></data>'
    server = canned({"get-config": [bad]}, CONFIRMED)
    d = driver(server.port, timeout=2)
    with pytest.raises(OcsUnavailable, match=r"malformed reply to read-back after commit"):
        d.apply(set(), {(1, 12)})
    assert not d.connected and not d.cancel()
    d.confirm()  # nothing waits
    assert server.seen == ["lock", "edit-config", "commit", "get-config", "close-session"]  # no confirm
    server = canned({"commit": ["DROP"]}, CONFIRMED)
    d = driver(server.port, timeout=2)
    with pytest.raises(OcsUnavailable, match=r"confirmed commit \(ports 6, 7\)"):
        d.apply(set(), {(6, 7)})
    assert not d.connected and not d.cancel()
