"""The TL1 driver against the emulated TL1 switch on loopback."""
import time

import pytest

from controller.core.errors import OcsUnavailable
from controller.core.rack import Ocs
from controller.drivers.errors import Tl1Error
from controller.drivers.tl1 import Tl1Client, Tl1Ocs
from emulation.tl1_ocs import Tl1Ocs as Device
from emulation.tl1_ocs import Tl1Server


@pytest.fixture
def device():
    dev = Device(ports=32, switching_ms=40, user="admin", password="pw")
    server = Tl1Server(dev, "127.0.0.1", 0)
    server.start()
    yield dev, server.server_address[1]
    server.shutdown()
    server.server_close()


def driver(port, password="pw"):
    spec = Ocs(name="ocs1", ports=32, dpid=1, switching_time_ms=40, driver="tl1", address=f"127.0.0.1:{port}")
    return Tl1Ocs(spec, "admin", password)


def test_make_read_and_delete_cross_connects(device):
    dev, port = device
    d = driver(port)
    assert not d.connected and d.last_seen is None  # nothing asked yet: connected is what is known, not a login
    assert d.read() == set() and d.connected and d.last_seen is not None
    t0 = time.time()
    r = d.apply(set(), {(1, 11), (2, 12)})
    assert r.dark_end - t0 >= 0.04  # the device answered only after its mirrors settled
    assert d.read() == {(1, 11), (2, 12)}
    r = d.apply({(2, 12)}, {(2, 13)})
    assert d.read() == {(1, 11), (2, 13)}
    assert r.switching_time_s == 0.04
    d.replace({(5, 6)})
    assert d.read() == {(5, 6)} and dev.patches == {5: 6, 6: 5}
    d.close()
    assert dev.commands[0] == "ACT-USER" and dev.commands[-1] == "CANC-USER"


def test_refusals_are_errors(device):
    _, port = device
    d = driver(port)
    d.apply(set(), {(1, 11)})
    with pytest.raises(Tl1Error, match="SROF"):
        d.apply(set(), {(1, 12)})  # port 1 is taken
    with pytest.raises(Tl1Error, match="IIAC"):
        d.apply(set(), {(3, 99)})  # beyond the port count
    with pytest.raises(Tl1Error, match="IENE"):
        d.apply({(7, 8)}, set())
    assert d.read() == {(1, 11)}


def test_bad_login_and_no_device():
    with pytest.raises(OcsUnavailable, match="cannot reach"):
        driver(1).read()


def test_wrong_password(device):
    _, port = device
    d = driver(port, password="nope")
    assert not d.connected
    with pytest.raises(OcsUnavailable, match="login refused"):
        d.read()


def test_client_requires_login(device):
    _, port = device
    c = Tl1Client("127.0.0.1", port)
    with pytest.raises(Tl1Error, match="PLNA"):
        c.command("RTRV-PATCH")
    c.close()


# --- the OCS app keeps a TL1 device in step: reconnects, resynchronises, answers status from memory ---

@pytest.fixture
def tl1_rack(monkeypatch):
    """The paper rack whose OCS is the emulated TL1 switch on loopback, with fast probes and retries."""
    from eventlet.green import socket as green_socket
    from ryu import cfg

    import controller.config  # noqa: F401  (registers the [optirack] options)
    import controller.drivers.tl1 as tl1
    from controller.core.rack import load_rack
    from tests.unit.test_rack import PAPER

    monkeypatch.setattr(tl1, "socket", green_socket)  # cooperative, as under ryu-manager's monkey patching
    server = Tl1Server(Device(ports=320, switching_ms=25, user="admin", password="pw"), "127.0.0.1", 0)
    server.start()
    port = server.server_address[1]
    rack = load_rack(PAPER)
    data = rack.spec.model_dump(mode="json")
    data["ocs"][0].update(driver="tl1", address=f"127.0.0.1:{port}")
    for name, value in (("tl1_password", "pw"), ("device_probe_interval", 0.2), ("device_retry_max", 0.4)):
        cfg.CONF.set_override(name, value, group="optirack")
    yield type(rack)(type(rack.spec).model_validate(data)), server, port
    for name in ("tl1_password", "device_probe_interval", "device_retry_max"):
        cfg.CONF.clear_override(name, group="optirack")
    server.power_off()


def _topology(ctx):
    import json

    from ryu.app.wsgi import WSGIApplication
    from webob import Request

    from controller.apps.rest import Api

    app = WSGIApplication()
    app.register(Api, {"optirack": ctx})
    return json.loads(Request.blank("/api/v1/topology").get_response(app).body)["ocs"]["ocs1"]


def test_a_restarted_tl1_ocs_is_reconnected_and_resynchronised(tl1_rack, tmp_path):
    from controller.apps.context import Optirack
    from controller.apps.fabric import FabricApp
    from controller.apps.ocs import OcsApp
    from controller.core.circuits import CircuitMap
    from tests.unit.fakes import wait_until

    rack, server, port = tl1_rack
    ctx = Optirack(rack=rack, state_dir=tmp_path)
    app = OcsApp(optirack=ctx)
    FabricApp(optirack=ctx)
    try:
        wait_until(lambda: "ocs1" in app.synchronised, 10, "first contact")
        assert server.device.patches and _topology(ctx)["connected"] is True  # the empty device got the rack file's
        target = CircuitMap.parse(rack, [["ocs1:1", "ocs1:14"], ["ocs1:2", "ocs1:15"]])
        app.changes.reconfigure(target, "circuits", "test")
        held = {(a.port, b.port) for a, b in target.circuits}

        server.power_off()  # the device restarts: sessions dropped, state lost
        wait_until(lambda: not app.drivers["ocs1"].connected, 10, "the probe to notice the lost session")
        opens = []
        real_open = app.drivers["ocs1"].client.open
        app.drivers["ocs1"].client.open = lambda: (opens.append(1), real_open())[1]
        status = _topology(ctx)
        assert opens == [], "GET /topology tried to log in"
        assert status["connected"] is False and status["synchronised"] is False
        assert status["last_seen"] is not None and "ocs1" not in app.synchronised
        wait_until(lambda: len(opens) >= 2, 10, "the driver to retry by itself")

        reborn = Tl1Server(Device(ports=320, switching_ms=25, user="admin", password="pw"), "127.0.0.1", port)
        reborn.start()
        try:
            wait_until(lambda: "ocs1" in app.synchronised, 10, "the driver to reconnect and resynchronise")
            pairs = {(a, b) for a, b in reborn.device.patches.items() if a < b}
            assert pairs == held  # our circuits, put back on the empty device
            assert ctx.events.recent()[-1].kind == "restore" and ctx.events.recent()[-1].status == "ok"
            assert _topology(ctx)["connected"] is True
        finally:
            reborn.power_off()
    finally:
        for keeper in app.keepers:
            keeper.kill()
