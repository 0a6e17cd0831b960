"""The emulated fabric's settings (lossless or droptail) and the demo's verdict on its counters, without a rack."""
from __future__ import annotations

import pytest
import yaml

from controller.core.emulated import WINDOW_SEGMENTS, route_window
from controller.core.rack import RackError, load_rack
from emulation import counters
from emulation import shares as sharecheck
from emulation.shaping import QUEUE_FRAMES, htb_commands, queue_frames
from evidence.demo.experiment import fabric_checks, passed
from tests.unit.test_rack import PAPER


def test_the_default_fabric_is_lossless_and_droptail_is_kept(tmp_path):
    assert load_rack(PAPER).spec.emulation.fabric == "lossless"
    spec = yaml.safe_load(PAPER.read_text())
    spec["emulation"]["fabric"] = "droptail"
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(spec))
    assert load_rack(tmp_path / "r.yaml").spec.emulation.fabric == "droptail"
    spec["emulation"]["fabric"] = "pfc"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(RackError, match="fabric"):
        load_rack(tmp_path / "bad.yaml")


def test_lossless_queues_hold_every_window_that_can_meet_there():
    gpus = 6
    frames = queue_frames("lossless", gpus)
    assert frames >= gpus * 2 * WINDOW_SEGMENTS  # each GPU's two ring connections, each way
    assert queue_frames("droptail", gpus) == QUEUE_FRAMES < frames
    with pytest.raises(ValueError, match="unknown fabric"):
        queue_frames("red", gpus)
    limits = [c[c.index("limit") + 1] for c in htb_commands(50, 9000, frames) if "limit" in c]
    assert limits == [str(frames * 9014)] * 2


def test_a_fair_port_gives_each_address_its_own_queue_and_an_equal_part():
    """htb's deficit round robin among leaves of one priority, one leaf per destination, each with an equal
    guaranteed part and the whole line as its ceiling; acknowledgements still ahead; the rest to a default leaf."""
    cmds = htb_commands(50, 9000, 120, flows=["198.18.0.1", "198.18.0.2"])
    classes = {c[c.index("classid") + 1]: c for c in cmds if c[:2] == ["class", "replace"]}
    leaves = {k: c for k, c in classes.items() if c[c.index("parent") + 1] == "5:20"}
    assert set(leaves) == {"5:99", "5:100", "5:101"}
    assert {c[c.index("rate") + 1] for c in leaves.values()} == {"15Mbit"}  # 0.9 x 50 / 3
    assert {c[c.index("ceil") + 1] for c in leaves.values()} == {"50Mbit"}
    assert {c[c.index("prio") + 1] for c in leaves.values()} == {"1"}
    queued = {c[c.index("parent") + 1] for c in cmds if c[:2] == ["qdisc", "replace"] and "bfifo" in c}
    assert queued == {"5:10", *leaves}  # a queue on every leaf, none on the inner bulk class
    filters = {c[c.index("dst") + 1]: c[-1] for c in cmds if c[0] == "filter" and "dst" in c}
    assert filters == {"198.18.0.1/32": "5:100", "198.18.0.2/32": "5:101"}
    assert cmds[0][-2:] == ["default", "99"]


def test_only_the_lossless_fabric_shares_uplinks_fairly():
    import yaml

    from controller.core.rack import parse_rack
    from emulation.topo import RackTopo
    from tests.unit.test_rack import PAPER

    for fabric, fair in (("lossless", True), ("droptail", False)):
        data = yaml.safe_load(PAPER.read_text())
        data.setdefault("emulation", {})["fabric"] = fabric
        rack = parse_rack(data)
        topo = RackTopo(rack=rack)
        uplinks = [topo.linkInfo(a, b) for a, b in topo.links() if {a, b} <= {w.name for w in rack.spec.switches}]
        assert uplinks and all(bool(i["params1"]["flows"]) == fair for i in uplinks), fabric


def test_an_uplinks_bucket_holds_a_millisecond_and_a_nics_two_frames():
    """After an idle phase htb passes its bucket and one frame at once: on the paper rack's 6.5 Mbit/s uplink two
    frames let each ring step's first 27 kB beat the line rate; the NICs keep theirs (in the measured step cost)."""
    import yaml

    from controller.core.rack import parse_rack
    from emulation.calibrate import parse_bucket
    from emulation.shaping import bucket_bytes
    from emulation.topo import RackTopo
    from tests.unit.test_rack import PAPER

    rack = parse_rack(yaml.safe_load(PAPER.read_text()))
    topo = RackTopo(rack=rack)
    switches = {w.name for w in rack.spec.switches}
    links = [topo.linkInfo(a, b) for a, b in topo.links()]
    uplinks = [i for i in links if {i["node1"], i["node2"]} <= switches]
    nics = [i for i in links if i not in uplinks and "bw" in i["params1"]]
    assert uplinks and nics
    for info in uplinks:
        for params in (info["params1"], info["params2"]):
            assert params["bucket"] == bucket_bytes(params["bw"]) == int(params["bw"] * 1e6 / 8 * 1e-3) < 9014
            cmds = htb_commands(params["bw"], params["mtu"], params["frames"], params["flows"], params["bucket"])
            classes = [c for c in cmds if c[:2] == ["class", "replace"]]
            assert {(c[c.index("burst") + 1], c[c.index("cburst") + 1]) for c in classes} == {
                (str(params["bucket"]),) * 2}
    for info in nics:
        assert info["params1"]["bucket"] is None and info["params2"]["bucket"] is None
        cmd = htb_commands(info["params1"]["bw"], info["params1"]["mtu"])[1]
        assert cmd[cmd.index("burst") + 1] == str(2 * (info["params1"]["mtu"] + 14))
    # what the calibration reads back to restore a shaper it took off
    assert parse_bucket("class htb 5:1 root rate 6500Kbit ceil 6500Kbit burst 810b cburst 810b \n") == 810
    assert parse_bucket("class htb 5:1 root rate 50Mbit ceil 50Mbit burst 17.5Kb cburst 17.5Kb\n") == 17920
    assert parse_bucket("class htb 5:20 parent 5:1 prio 1 rate 6Mbit ceil 6500Kbit burst 812b\n") is None


def test_only_the_lossless_fabric_locks_each_flows_window():
    lossless = " ".join(route_window("lossless"))
    assert f"cwnd lock {WINDOW_SEGMENTS}" in lossless and f"initcwnd {WINDOW_SEGMENTS}" in lossless
    assert "lock" not in route_window("droptail") and "64" in route_window("droptail")


def test_drops_between_keeps_every_counter_read_grown_or_not():
    before = {"root as1-p7 qdisc 20:": 3, "root ocs1-p1 tx": 0, "root as1-p2 rx": 9}
    after = {"root as1-p7 qdisc 20:": 10, "root ocs1-p1 tx": 0, "ovs packet socket 9": 2, "root as1-p2 rx": 4}
    assert counters.drops_between(before, after) == {"ovs packet socket 9": 2, "root as1-p2 rx": 4,
                                                     "root as1-p7 qdisc 20:": 7, "root ocs1-p1 tx": 0}
    # a counter read as zero is no drop
    assert counters.verdict({"root ocs1-p1 tx": 0}, []) == []


def _failing(fail: str):
    """A subprocess.run whose command `fail` exits 1, the others print nothing to read."""
    import subprocess

    def run(cmd, **kw):
        if cmd[0] == fail:
            return subprocess.CompletedProcess(cmd, 1, "", "Cannot open netlink socket")
        return subprocess.CompletedProcess(cmd, 0, "[]" if "-j" in cmd else "", "")
    return run


def test_a_failed_read_is_an_error_not_an_empty_reading(monkeypatch):
    monkeypatch.setattr(counters.subprocess, "run", _failing("tc"))
    with pytest.raises(counters.ReadError, match="tc.*failed.*netlink"):
        counters.queue_drops({"as1-p7"})
    assert "tc" in counters.read(["as1-p7"])  # read() hands back the error's text


def test_output_that_does_not_parse_is_an_error(monkeypatch):
    import subprocess
    monkeypatch.setattr(counters.subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, 0, "not json", ""))
    with pytest.raises(counters.ReadError, match="no JSON"):
        counters.link_drops(set())


def test_a_snapshot_must_hold_every_interface_and_namespace_it_should():
    snap = {"root as1-p7 rx": 0, "root as1-p7 tx": 0, "optirack-s1 lo rx": 0, "softnet cpu0": 0}
    assert counters.missing_from(snap, ["as1-p7"], ["optirack-s1"]) == []
    assert counters.missing_from(snap, ["as1-p7", "as1-p8"], ["optirack-s1", "optirack-s2"]) == [
        "root as1-p8 rx", "root as1-p8 tx", "namespace optirack-s2"]
    assert counters.missing_from({}, [], []) == ["softnet counters"]


def test_the_demos_fabric_check_sees_a_failed_read_as_an_error_and_a_drop_as_a_drop(monkeypatch):
    before = {"root as1-p7 rx": 0, "root as1-p7 tx": 0, "softnet cpu0": 0}
    dropped = counters.fabric_record(before, {**before, "root as1-p7 tx": 5}, [])
    assert dropped["errors"] == [] and dropped["problems"] == ["5 packets dropped at root as1-p7 tx"]
    monkeypatch.setattr(counters.subprocess, "run", _failing("ip"))
    unread = counters.fabric_record(before, counters.read(["as1-p7"]), [])
    assert unread["drops"] == {} and len(unread["errors"]) == 1 and "after the run" in unread["errors"][0]
    assert unread["problems"][0].startswith("drop counters not read: after the run")
    record = {"fabric": "lossless", "calibration": {"runs": [{"fabric_counters": {"problems": []}}]},
              "runs": [{"tag": "case a fragmented #1", "fabric_counters": dropped},
                       {"tag": "case a regrouped #1", "fabric_counters": unread}], "sweep": []}
    got = fabric_checks(record)
    assert not got["fabric_clean"]
    assert got["fabric_drops"] == {"root as1-p7 tx": 5}  # the drop, as a drop
    assert got["fabric_read_errors"] == [f"case a regrouped #1: {unread['errors'][0]}"]  # the failed read, as an error
    record["checks"] = {"signs_kept": True, "spread_ok": True, "sweep_monotonic": False, **got}
    assert not passed(record)
    record["runs"] = record["runs"][1:]  # the failed read alone: no drop counted, and still not clean
    record["checks"].update(fabric_checks(record))
    assert record["checks"]["fabric_drops"] == {} and not passed(record)


def test_verdict_names_the_port_and_the_job_that_retransmitted():
    tcp = [{"nics": ["gpu1"], "retrans": 5, "out": 1000}, {"nics": ["gpu2"], "retrans": 11, "out": 1000},
           {"nics": ["gpu3"], "retrans": 0, "out": 0}]
    bad = counters.verdict({"root as1-p7 qdisc 20:": 7}, tcp)
    assert bad[0] == "7 packets dropped at root as1-p7 qdisc 20:"
    assert len(bad) == 2 and bad[1].startswith("gpu2: 11 of 1000")


def test_a_nic_in_a_container_that_dropped_is_named_with_its_container():
    tcp = [{"nics": ["gpu5"], "retrans": 0, "out": 1000, "nic_drops": {"gpu5 rx": 0, "gpu5 tx": 3}}]
    assert counters.verdict({}, tcp) == ["3 packets dropped at gpu5 tx (in the container of gpu5)"]
    tcp[0]["nic_drops"]["gpu5 tx"] = 0
    assert counters.verdict({}, tcp) == []


def test_a_namespaces_nics_are_read_with_their_drops(tmp_path, monkeypatch):
    dev = tmp_path / "1" / "net"
    dev.mkdir(parents=True)
    (dev / "dev").write_text(
        "Inter-|   Receive  |  Transmit\n face |bytes packets errs drop fifo frame compressed multicast|...\n"
        "    lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n"
        "  gpu5: 900 9 0 2 0 0 0 0 800 8 0 7 0 0 0 0\n")
    from pathlib import Path

    def fake(path="", *rest):
        return Path(str(path).replace("/proc", str(tmp_path)), *rest)

    monkeypatch.setattr(counters, "Path", fake)
    assert counters._nics("1") == {"gpu5": (2, 7)}


def _record(problems: list[str]) -> dict:
    return {"fabric": "droptail", "calibration": {"runs": [{"fabric_counters": {"problems": []}}]},
            "runs": [{"tag": "case a fragmented #1", "fabric_counters": {"problems": problems}}], "sweep": []}


def test_a_drop_fails_the_demo_and_is_named_with_its_run():
    record = _record(["7 packets dropped at root as1-p7 qdisc 20:"])
    record["checks"] = {"signs_kept": True, "spread_ok": True, "sweep_monotonic": False, **fabric_checks(record)}
    assert record["checks"]["fabric_problems"] == ["case a fragmented #1: 7 packets dropped at root as1-p7 qdisc 20:"]
    assert not passed(record)
    clean = _record([])
    clean["checks"] = {"signs_kept": True, "spread_ok": True, "sweep_monotonic": False, **fabric_checks(clean)}
    assert passed(clean)  # no sweep: its check does not apply
    clean["checks"]["spread_ok"] = False
    assert not passed(clean)


def _summary(compute: float, comm: float) -> dict:
    return {"completion_s": 10 * (compute + comm), "mean_iteration_rack_s": compute + comm,
            "mean_compute_rack_s": compute, "mean_comm_rack_s": comm, "host_idle_percent": 5.0,
            "host_steal_percent": 0.2}


def test_a_slow_repeat_is_named_with_where_its_time_went():
    from evidence.demo.experiment import disturbed

    fixed = [_summary(0.2, 0.5)] * 3
    regroup = [_summary(0.2, 0.1), _summary(0.2, 0.1), _summary(0.27, 0.1)]  # the third: compute slowed
    out = disturbed(list(zip(fixed, regroup, strict=True)))
    assert len(out) == 1
    d = out[0]
    assert (d["policy"], d["repeat"], d["by"]) == ("regroup", 2, "compute")
    assert d["slower_by"] == pytest.approx(0.07 / 0.3) and d["host_idle_percent"] == 5.0
    assert disturbed(list(zip(fixed, fixed, strict=True))) == []


def test_uplink_shares_compare_each_crossing_flow_with_an_even_split_of_a_busy_uplink():
    cap = 8e6  # bit/s: 0.5 MB per 0.5 s window
    red, blue = {"198.18.0.1"}, {"198.18.0.5"}
    samples = [(0.0, {"as1:10 198.18.0.1": 0, "as1:10 198.18.0.5": 0})]
    for i in range(1, 6):  # red gets 300 kB, blue 150 kB of each window: blue is short of its share
        samples.append((0.5 * i, {"as1:10 198.18.0.1": 300_000 * i, "as1:10 198.18.0.5": 150_000 * i}))
    shares = sharecheck.uplink_shares(samples, cap, [red, blue])
    assert shares["windows"] == 5
    assert shares["flows"]["as1:10 198.18.0.1"]["error"] == pytest.approx(300 / 225 - 1)
    assert shares["flows"]["as1:10 198.18.0.5"]["share"] == pytest.approx(0.3)
    problems = sharecheck.share_problems(shares)
    assert len(problems) == 2 and problems[0].startswith("uplink as1:10: the flow to 198.18.0.1 got +33 %")
    assert sharecheck.uplink_shares(samples, cap, [red])["windows"] == 0  # one ring alone: no sharing to judge


def test_a_flow_seen_in_too_few_windows_is_kept_but_not_judged():
    cap = 8e6
    red, blue = {"198.18.0.1"}, {"198.18.0.5"}
    a, b = "as1:10 198.18.0.1", "as1:10 198.18.0.5"

    def run(n):  # both queued; red 300 kB, blue 150 kB a window: blue 33 % short of the even split
        return [(0.5 * i, {a: 300_000 * i, b: 150_000 * i}, {a: 2, b: 2}) for i in range(n + 1)]

    few = sharecheck.uplink_shares(run(sharecheck.MIN_SHARE_WINDOWS - 1), cap, [red, blue])
    assert few["flows"][b]["error"] == pytest.approx(-1 / 3) and not few["flows"][b]["judged"]
    assert sharecheck.share_problems(few) == [] and sharecheck.unjudged_flows(few) == [a, b]
    enough = sharecheck.uplink_shares(run(sharecheck.MIN_SHARE_WINDOWS), cap, [red, blue])
    assert enough["flows"][b]["windows"] == sharecheck.MIN_SHARE_WINDOWS and enough["flows"][b]["judged"]
    problems = sharecheck.share_problems(enough)
    assert len(problems) == 2 and f"over {sharecheck.MIN_SHARE_WINDOWS} windows" in problems[1]
    assert sharecheck.unjudged_flows(enough) == []


def test_one_misread_window_does_not_decide_a_flow_but_a_port_that_favours_one_flow_does():
    cap = 8e6  # 0.5 MB per 0.5 s window
    red, blue = {"198.18.0.1"}, {"198.18.0.5"}
    a, b = "as1:10 198.18.0.1", "as1:10 198.18.0.5"
    per_window = [(250_000, 250_000)] * 5 + [(400_000, 100_000)]  # last: blue drained mid-window, queued at ends
    samples, sa, sb = [(0.0, {a: 0, b: 0}, {a: 2, b: 2})], 0, 0
    for i, (da, db) in enumerate(per_window, 1):
        sa, sb = sa + da, sb + db
        samples.append((0.5 * i, {a: sa, b: sb}, {a: 2, b: 2}))
    flows = sharecheck.uplink_shares(samples, cap, [red, blue])["flows"]
    assert flows[a]["error"] == 0 and flows[a]["window_errors"] == [0.0] * 5 + [0.6]
    assert flows[a]["error_of_means"] == pytest.approx(275 / 250 - 1)  # the mean would carry the misread window
    biased = [(0.5 * i, {a: 300_000 * i, b: 200_000 * i}, {a: 2, b: 2}) for i in range(7)]  # every window 20 % off
    flows = sharecheck.uplink_shares(biased, cap, [red, blue])["flows"]
    assert flows[a]["error"] == pytest.approx(0.2) and flows[b]["error"] == pytest.approx(-0.2)
    assert len(sharecheck.share_problems({"flows": flows})) == 2


def test_retransmissions_in_an_ocs_dark_window_are_counted_apart():
    tcp = [{"nics": ["gpu5"], "retrans": 20, "out": 1000,
            "history": [(100.0, 0), (100.5, 15), (101.0, 15), (110.0, 15), (110.5, 20)]}]
    counters.dark_retransmissions(tcp, [(100.2, 100.4)])
    assert tcp[0]["retrans_dark"] == 15 and "history" not in tcp[0]
    bad = counters.verdict({}, tcp)  # 5 of 1000 outside the dark window: within 1 %
    assert bad == []
    tcp[0]["retrans_dark"] = 0
    assert counters.verdict({}, tcp)[0].startswith("gpu5: 20 of 1000")


def test_only_windows_inside_every_rings_all_reduce_are_judged():
    from evidence.demo.runs import all_reduces

    job = {"ranks": {"gpu1": [{"t_start": 0.0, "compute_s": 1.0, "t_end": 3.0}],
                     "gpu2": [{"t_start": 0.0, "compute_s": 1.5, "t_end": 3.2}]}}
    assert all_reduces(job) == [(1.5, 3.0)] and all_reduces(None) == []
    samples = [(0.5 * i, {"as1:10 198.18.0.1": 250_000 * i, "as1:10 198.18.0.5": 250_000 * i}) for i in range(8)]
    rings = [{"198.18.0.1"}, {"198.18.0.5"}]
    assert sharecheck.uplink_shares(samples, 8e6, rings)["windows"] == 7
    assert sharecheck.uplink_shares(samples, 8e6, rings, [[(1.5, 3.0)], [(0.0, 9.0)]])["windows"] == 3


def _u32_matches(rule: list[str], packet: bytes) -> bool:
    """The u32 matches of `rule` (ip protocol, u16/u8 value mask at offset) applied to an IPv4 packet."""
    i = 0
    while i < len(rule):
        if rule[i] != "match":
            i += 1
            continue
        if rule[i + 1] == "ip" and rule[i + 2] == "protocol":
            if packet[9] & int(rule[i + 4], 16) != int(rule[i + 3]):
                return False
            i += 5
            continue
        width = {"u8": 1, "u16": 2}[rule[i + 1]]
        value, mask, offset = int(rule[i + 2], 16), int(rule[i + 3], 16), int(rule[i + 5])
        if int.from_bytes(packet[offset:offset + width], "big") & mask != value:
            return False
        i += 6
    return True


def test_only_pure_acknowledgements_go_ahead_of_data():
    """A FIN (or a small data segment) ahead of its flow's queued segments arrives out of order and TCP retransmits
    what it skipped: only ACK-alone segments with no payload (ECN bits ignored) take the acknowledgement class."""
    import struct

    from emulation.shaping import ACK_ONLY

    def tcp(flags: int, payload: int = 0, options: int = 12) -> bytes:
        words = (20 + options) // 4
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + 4 * words + payload, 0, 0, 64, 6, 0, bytes(4), bytes(4))
        return ip + struct.pack("!HHIIBBHHH", 1, 2, 0, 0, words << 4, flags, 0, 0, 0) + bytes(options + payload)

    def ahead(packet: bytes) -> bool:
        return any(_u32_matches(match, packet) for match in ACK_ONLY)

    ack, fin, psh, ece, syn, rst = 0x10, 0x11, 0x18, 0x50, 0x12, 0x14
    assert ahead(tcp(ack)) and ahead(tcp(ece | ack)) and ahead(tcp(ack, options=0)) and ahead(tcp(ack, options=40))
    assert ahead(tcp(ack, options=24))  # timestamps and one SACK block
    for flags in (fin, psh, syn, rst):
        assert not ahead(tcp(flags)), hex(flags)
    assert not ahead(tcp(ack, payload=200))  # a full data segment
    assert not ahead(tcp(ack, payload=8))  # a small data segment without PSH: its flow's order stays
    udp = bytearray(tcp(ack))
    udp[9] = 17
    assert not ahead(bytes(udp))
    with_options = bytearray(tcp(ack))
    with_options[0] = 0x46  # IP options move the TCP header: not matched at fixed offsets
    assert not ahead(bytes(with_options))


def test_htb_classes_are_read_from_tcs_text():
    text = """class htb 5:1 root rate 6900Kbit ceil 6900Kbit burst 18027b cburst 18027b
 Sent 4409210 bytes 498 pkt (dropped 0, overlimits 12 requeues 0)
 backlog 0b 0p requeues 0
 lended: 0 borrowed: 0 giants: 0
class htb 5:101 parent 5:20 leaf 101: prio 1 rate 887136bit ceil 6900Kbit burst 18027b cburst 18027b
 Sent 2204605 bytes 249 pkt (dropped 3, overlimits 0 requeues 0)
 backlog 27042b 3p requeues 0
"""
    classes = counters.parse_classes(text)
    assert classes["5:1"]["bytes"] == 4409210 and classes["5:1"]["drops"] == 0
    assert classes["5:101"] == {"bytes": 2204605, "packets": 249, "drops": 3, "backlog_bytes": 27042,
                                "backlog_packets": 3}


def test_a_flow_with_nothing_queued_gets_what_it_asked_and_the_held_ones_split_the_rest():
    cap = 8e6  # 0.5 MB per 0.5 s window
    red, blue, green = {"198.18.0.1"}, {"198.18.0.5"}, {"198.18.0.6"}
    a, b, c = "as1:10 198.18.0.1", "as1:10 198.18.0.5", "as1:10 198.18.0.6"
    samples = []
    for i in range(5):  # red asks 100 kB a window (nothing queued); blue and green queue and get 200 kB each
        samples.append((0.5 * i, {a: 100_000 * i, b: 200_000 * i, c: 200_000 * i}, {a: 0, b: 3, c: 5}))
    shares = sharecheck.uplink_shares(samples, cap, [red, blue, green])
    assert shares["windows"] == 4
    assert all(abs(f["error"]) < 1e-9 for f in shares["flows"].values())  # max-min: no flow off
    assert sharecheck.share_problems(shares) == []
    # a FIFO that favours green: both queued, green 250 kB, blue 150 kB -> both 25 % off their 200 kB
    unfair = [(0.5 * i, {a: 100_000 * i, b: 150_000 * i, c: 250_000 * i}, {a: 0, b: 3, c: 5}) for i in range(5)]
    flows = sharecheck.uplink_shares(unfair, cap, [red, blue, green])["flows"]
    assert flows[b]["error"] == pytest.approx(-0.25) and flows[c]["error"] == pytest.approx(0.25)
    # a flow with nothing queued that got more than the even split of the held ones is off too
    greedy = [(0.5 * i, {a: 250_000 * i, b: 120_000 * i, c: 120_000 * i}, {a: 0, b: 3, c: 5}) for i in range(5)]
    flows = sharecheck.uplink_shares(greedy, cap, [red, blue, green])["flows"]
    assert flows[a]["error"] == pytest.approx(250 / 120 - 1)
    # nothing queued by anyone: no flow was held back at the port, nothing to judge
    idle = [(0.5 * i, {a: 200_000 * i, b: 200_000 * i}, {a: 0, b: 0}) for i in range(5)]
    assert sharecheck.uplink_shares(idle, cap, [red, blue])["windows"] == 0


def test_the_fair_leaves_addresses_are_read_from_the_u32_filters(monkeypatch):
    head = ("filter parent 5: protocol ip pref {} u32 chain 0 fh 80{}::800 order 2048 key ht 80{} bkt 0 "
            "*flowid {} not_in_hw")
    text = "\n".join([head.format(1, 0, 0, "5:10"), "  match 00060000/00ff0000 at 8",
                      head.format(2, 1, 1, "5:103"), "  match c6120004/ffffffff at 16",
                      head.format(2, 2, 2, "5:104"), "  match c6120005/ffffffff at 16"])
    monkeypatch.setattr(sharecheck, "_run", lambda *cmd: text)
    assert sharecheck.leaf_addresses("as1-p10") == {"5:103": "198.18.0.4", "5:104": "198.18.0.5"}
