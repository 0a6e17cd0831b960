"""The TL1 driver against the emulated TL1 switch on loopback."""
import time

import pytest

from controller.core.rack import Ocs
from controller.drivers.ocs import OcsUnavailable
from controller.drivers.tl1 import Tl1Client, Tl1Error, Tl1Ocs
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
    assert d.connected and d.read() == set()
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
