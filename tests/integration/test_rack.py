"""The emulated rack: bridges as the rack file says, connectivity, line rates, and a clean rack-down."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from controller.core.circuits import CircuitMap
from controller.core.emulated import nic_port
from controller.core.rack import load_rack
from emulation import ovs
from emulation.calibrate import RateCheck, _fair_flows, without_shapers
from emulation.shaping import queue_frames
from tests.integration.helpers import (
    PAPER,
    RACK8,
    free_port,
    install_forwarding_by_hand,
    iperf_mbps,
    ofctl,
    optirack_rack,
    ping,
    set_circuits_by_hand,
    sh,
    wait_for,
)

NOBODY = f"127.0.0.1:{free_port()}"  # a controller address where nobody listens


def _leftovers() -> dict:
    bridges = [b for b in sh("ovs-vsctl", "list-br").split()
               if "optirack-rack" in sh("ovs-vsctl", "get", "bridge", b, "external_ids")]
    netns = [n.split()[0] for n in sh("ip", "netns", "list").splitlines() if n.startswith("optirack-")]
    intfs = [line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link").splitlines()
             if any(line.split(":")[1].strip().startswith(p)
                    for p in ("ocs1-p", "as1-p", "as2-p", "as3-p", "core-p", "mg-", "optirack-mgmt"))]
    shells = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if (
                    b"mininet:" in cmdline
                    or b"/run/optirack/engines/" in cmdline
                    or b"/run/optirack/registry/" in cmdline
                ):
                    shells.append(pid + " " + cmdline.replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return {k: v for k, v in {"bridges": bridges, "netns": netns, "interfaces": intfs, "shells": shells}.items() if v}


@pytest.fixture(scope="module")
def paper_rack():
    proc = optirack_rack("up", "--topo", str(PAPER), "--controller", NOBODY, "--wait", "0")
    yield load_rack(PAPER), proc.stdout
    optirack_rack("down")


def test_bridges_have_the_rack_file_port_numbers(paper_rack):
    rack, out = paper_rack
    assert "rack paper is up" in out
    for ocs in rack.spec.ocs:
        ports = {int(sh("ovs-vsctl", "get", "interface", f"{ocs.name}-p{p.port}", "ofport")) for p in rack.endpoints}
        assert ports == {p.port for p in rack.endpoints}
    for w in rack.spec.switches:
        for link in w.downlinks + w.uplinks:
            assert int(sh("ovs-vsctl", "get", "interface", f"{w.name}-p{link.port}", "ofport")) == link.port
    for name in ["ocs1", "as1", "as2"]:
        assert sh("ovs-vsctl", "get", "bridge", name, "datapath_type").strip() == "netdev"
        assert sh("ovs-vsctl", "get", "bridge", name, "fail_mode").strip() == "secure"
        assert sh("ovs-vsctl", "get", "bridge", name, "protocols").strip() == "[OpenFlow13]"
        assert sh("ovs-vsctl", "get-controller", name).strip() == f"tcp:{NOBODY}"


def test_starting_circuits_and_status(paper_rack):
    rack, _ = paper_rack
    status = json.loads(optirack_rack("status", "--json").stdout)
    expected = sorted([a.port, b.port] for a, b in rack.spec.circuits)
    assert status["circuits"]["ocs1"] == [list(map(int, c)) for c in expected]
    nic = rack.spec.emulation.mbps(rack.gpus["gpu1"].nic.rate_gbps)
    up = rack.spec.emulation.mbps(rack.switches["as1"].uplinks[0].rate_gbps)
    assert status["bridges"]["ocs1"]["ports"]["1"] == {"interface": "ocs1-p1", "mbps": nic}
    assert status["bridges"]["as1"]["ports"]["10"]["mbps"] == up
    assert status["bridges"]["ocs1"]["ports"]["11"] == {"interface": "ocs1-p11", "mbps": None}  # a patch port
    assert all(n["present"] for n in status["nics"].values())
    text = optirack_rack("status").stdout
    assert "circuits on ocs1: 1<->11" in text


def test_nothing_passes_without_forwarding(paper_rack):
    rack, _ = paper_rack
    for sw in ("as1", "as2"):
        ofctl("del-flows", sw)
    assert not ping("optirack-srv1", rack.addresses["gpu2"][0], count=1)


def test_same_switch_and_across_the_uplink(paper_rack):
    rack, _ = paper_rack
    # By hand: gpu1, gpu2 under as1 and gpu3 under as2.
    set_circuits_by_hand("ocs1", [(1, 11), (2, 12), (3, 21)])
    circuits = CircuitMap.parse(rack, [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:21"]])
    install_forwarding_by_hand(rack, circuits)
    ip = {g: rack.addresses[g][0] for g in rack.gpus}
    assert ping("optirack-srv1", ip["gpu2"])
    before = ofctl("dump-ports", "as1", "10")
    assert ping("optirack-srv1", ip["gpu3"], count=3)
    after = ofctl("dump-ports", "as1", "10")
    assert before != after, "the cross-switch ping did not cross the uplink"
    sh("ip", "link", "set", "dev", "as1-p10", "down")
    try:
        assert not ping("optirack-srv1", ip["gpu3"], count=1), "reached the other switch without the uplink"
        assert ping("optirack-srv1", ip["gpu2"], count=1)
    finally:
        sh("ip", "link", "set", "dev", "as1-p10", "up")
    # an unconnected NIC (gpu4 has no circuit now) is unreachable
    assert not ping("optirack-srv1", ip["gpu4"], count=1)


def _configured(dev: str, netns: str | None) -> tuple[float | None, int]:
    """The htb root rate of an interface (Mbit/s) and the bfifo limit of its bulk class (bytes; on a fair port,
    its default leaf's)."""
    out = sh("tc", *(["-n", netns] if netns else []), "qdisc", "show", "dev", dev)
    limit = next(
        (
            int(w[:-1]) if w.endswith("b") else int(w)
            for line in out.splitlines()
            if "bfifo 20:" in line or "bfifo 99:" in line
            for w in [line.split("limit ")[1].split()[0]]
        ),
        0,
    )
    return ovs.shaped_mbps(dev, netns), limit


def _check_path(rack, devices, rate, server_ns, server_ip, client_ns, client_ip, what):
    """The configured rates exactly, then throughput shaped and unshaped through the same bridges."""
    frame = rack.spec.emulation.mtu + 14
    frames = queue_frames(rack.spec.emulation.fabric, len(rack.gpus))  # lossless: every window that can meet
    for dev, netns in devices:
        assert _configured(dev, netns) == (rate, frames * frame), (dev, netns)
    fair = {dev: _fair_flows(dev, netns) for dev, netns in devices}  # a lossless uplink's leaves, one per address
    shaped = iperf_mbps(server_ns, server_ip, client_ns, client_ip, seconds=3)
    with without_shapers(devices):
        unshaped = iperf_mbps(server_ns, server_ip, client_ns, client_ip, seconds=3)
    for dev, netns in devices:  # put back exactly as it was
        assert _configured(dev, netns) == (rate, frames * frame), (dev, netns)
        assert _fair_flows(dev, netns) == fair[dev], (dev, netns)
    check = RateCheck(rate, shaped, unshaped)
    print(
        f"{what}: shaped {shaped:.1f} Mbit/s at a rate of {rate:g}; unshaped {unshaped:.1f} Mbit/s"
        + ("" if check.host_can_tell else " (this host cannot carry much more than the rate unshaped)")
    )
    assert not check.problems(), check.problems()
    return check


def test_line_rate_is_the_scaled_nic_rate(paper_rack):
    rack, _ = paper_rack
    set_circuits_by_hand("ocs1", [(1, 11), (2, 12)])
    install_forwarding_by_hand(rack, CircuitMap.parse(rack, [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"]]))
    ip = {g: rack.addresses[g][0] for g in rack.gpus}
    rate = rack.spec.emulation.mbps(rack.gpus["gpu1"].nic.rate_gbps)
    # gpu1 -> gpu2: shaped at gpu1's NIC port and at the OCS port facing gpu2 (both the NIC's rate)
    _check_path(
        rack,
        [(nic_port("gpu1"), "optirack-srv1"), ("ocs1-p2", None)],
        rate,
        "optirack-srv2",
        ip["gpu2"],
        "optirack-srv1",
        ip["gpu1"],
        "same switch",
    )


def test_rack8_up_rates_and_down():
    out = optirack_rack("up", "--topo", str(RACK8), "--controller", NOBODY, "--wait", "0").stdout
    try:
        assert "rack rack8 is up" in out and "5 bridges, 8 GPU NICs, 4 servers" in out
        rack = load_rack(RACK8)
        circuits = CircuitMap.initial(rack)
        install_forwarding_by_hand(rack, circuits)
        ip = {g: rack.addresses[g][0] for g in rack.gpus}
        assert ping("optirack-srv1", ip["gpu2"]) and ping("optirack-srv1", ip["gpu7"])
        rate = rack.spec.emulation.mbps(rack.switches["as1"].uplinks[0].rate_gbps)
        # gpu1 (as1) -> gpu7 (as3) crosses as1 -> core -> as3: the narrowest hops are the uplinks
        uplinks = [(f"{w.name}-p{u.port}", None) for w in rack.spec.switches for u in w.uplinks]
        if rack.spec.emulation.fabric == "lossless":
            assert all(_fair_flows(dev, None) == [rack.addresses[g][0] for g in rack.gpus] for dev, _ in uplinks)
        _check_path(
            rack,
            uplinks,
            rate,
            "optirack-srv4",
            ip["gpu7"],
            "optirack-srv1",
            ip["gpu1"],
            f"across two {rate:g} Mbit/s uplinks",
        )
    finally:
        optirack_rack("down")
    assert _leftovers() == {}


def test_rack_down_leaves_nothing_and_is_repeatable():
    optirack_rack("up", "--topo", str(PAPER), "--controller", NOBODY, "--wait", "0")
    again = optirack_rack("up", "--topo", str(PAPER), "--controller", NOBODY, "--wait", "0").stdout
    assert "taking it down first" in again
    optirack_rack("down")
    assert _leftovers() == {}
    assert "nothing was left" in optirack_rack("down").stdout
    assert optirack_rack("status", check=False).returncode == 1


def test_a_rack_up_that_fails_while_building_leaves_nothing(monkeypatch):
    # Mininet's nodes have their shells before the state names them: a failure there must end them (a controller
    # node's shell left by a failed rack-up made the next tests' leftover checks fail).
    from mininet.net import Mininet

    from emulation import rack as rackmod

    built = Mininet.build

    def build_then_fail(self):
        built(self)
        raise RuntimeError("made to fail once the nodes' shells were started")

    monkeypatch.setattr(Mininet, "build", build_then_fail)
    try:
        with pytest.raises(RuntimeError, match="made to fail"):
            rackmod.up(load_rack(PAPER), NOBODY, wait_connected=0)
        assert _leftovers() == {}
    finally:  # what a failure here leaves: Mininet's shells are this process's own children
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
                mine = int(stat[1]) == os.getpid() and b"mininet:" in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if mine:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        rackmod.down(quiet=True)


def test_rack_up_reports_controller_connections(controller):
    out = optirack_rack("up", "--topo", str(PAPER), "--controller", controller.of_target[4:]).stdout
    try:
        seconds = float(out.split(" is up in ")[1].split(" s")[0])
        print(f"rack-up of the paper rack: {seconds:.1f} s")
        assert seconds < 120  # catches a hang; about 2 s here, and noise on two busy cores must not fail it
        for b in ("ocs1", "as1", "as2"):
            assert f"{b:10s} controller connected" in out
        wait_for(lambda: "datapath 0x202 (as2) connected" in controller.output(), 10, "as2 in the controller log")
    finally:
        optirack_rack("down")


def test_bad_rack_file_changes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(PAPER.read_text().replace("rate_scale: 0.0005", "rate_scale: 0.5"))
    proc = optirack_rack("up", "--topo", str(bad), check=False)
    assert proc.returncode == 2
    assert "emulation shapes" in proc.stderr and "servers[0].gpus[0].nic.rate_gbps" in proc.stderr
    assert _leftovers() == {}


def test_mininet_cli_entry(tmp_path):
    import subprocess

    from tests.integration.helpers import BIN, ROOT

    proc = subprocess.run(
        [str(BIN / "optirack-rack"), "cli", "--controller", NOBODY],
        input="srv1 ip -br addr\nnet\nexit\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr  # Mininet prints to stderr
    assert "198.18.0.1/24" in out and "ocs1-p1:gpu1" in out
    assert _leftovers() == {}
