"""The controller, launched the documented way, against the emulated paper rack."""
from __future__ import annotations

import json
import subprocess

import pytest
import requests

from controller.client import ApiError
from controller.core.aggregators import tables as compute_tables  # the NICs' entries and the aggregators'
from controller.core.circuits import CircuitMap
from controller.core.rack import load_rack
from emulation import ovs
from tests.integration.helpers import (
    PAPER,
    iperf_mbps,
    ofctl,
    ping,
    sh,
    wait_for,
)

RACK = load_rack(PAPER)
IP = {g: RACK.addresses[g][0] for g in RACK.gpus}
REGROUPED = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:13"], ["ocs1:4", "ocs1:14"],
             ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]]
INITIAL = CircuitMap.initial(RACK).to_json()


def device_circuits() -> list[list[str]]:
    return sorted([f"ocs1:{a}", f"ocs1:{b}"] for a, b in ovs.circuits_of(ovs.circuit_flows("ocs1")))


def switch_table(name: str) -> dict[str, int]:
    table = {}
    for line in ofctl("dump-flows", name).splitlines():
        if "nw_dst=" in line:
            ip = line.split("nw_dst=")[1].split()[0].rstrip(",")
            table[ip] = int(line.split("output:")[1].split()[0])
    return table


@pytest.fixture
def initial(bed):
    """The shared testbed (see conftest), which starts each test from the rack file's circuits."""
    return bed.controller, bed.client


def test_put_makes_the_ocs_flows_equal_the_circuits(initial):
    _, client = initial
    body = client.put("/ocs/circuits", {"circuits": REGROUPED})
    assert body["circuits"] == sorted(REGROUPED)
    assert device_circuits() == sorted(REGROUPED)
    # exactly two flows per circuit, nothing else on the OCS
    assert len(ovs.circuit_flows("ocs1")) == 2 * len(REGROUPED)
    expected = compute_tables(RACK, CircuitMap.parse(RACK, REGROUPED))
    assert switch_table("as1") == expected["as1"] and switch_table("as2") == expected["as2"]


def test_nics_joined_by_circuits_ping_and_carry_traffic(initial):
    _, client = initial
    client.put("/ocs/circuits", {"circuits": REGROUPED})
    # gpu1..gpu4 now under as1, gpu5 and gpu6 under as2
    assert ping("optirack-srv1", IP["gpu4"]) and ping("optirack-srv1", IP["gpu6"])
    mbps = iperf_mbps("optirack-srv4", IP["gpu4"], "optirack-srv1", IP["gpu1"], seconds=3)
    rate = RACK.spec.emulation.mbps(100)
    print(f"gpu1 -> gpu4 under as1: {mbps:.1f} Mbit/s of {rate:g}")
    assert mbps <= 1.05 * rate  # the shapers hold (their rates are checked exactly in test_rack.py)
    stats = client.get("/stats/ports", history=30)["gpus"]
    seen = max(s["tx_bps"] for s in stats["gpu1"]["history"])
    assert seen > 0.5e6 * mbps, f"the monitor saw at most {seen / 1e6:.1f} Mbit/s of gpu1's {mbps:.1f}"
    # a NIC without a circuit is cut off
    client.put("/ocs/circuits", {"circuits": REGROUPED[:3]})
    assert not ping("optirack-srv1", IP["gpu4"], count=1)


def test_events_show_the_dark_window(initial):
    _, client = initial
    client.put("/ocs/circuits", {"circuits": REGROUPED})
    ev = client.get("/events", limit=1)["events"][-1]
    assert ev["kind"] == "circuits" and ev["status"] == "ok"
    assert ev["dark_window_s"] >= 0.025, ev
    assert (
        ev["requested_at"] <= ev["dark_start"] <= ev["dark_end"] <= ev["ocs_confirmed_at"] <= ev["flows_confirmed_at"]
    )
    assert sorted(ev["added"]) == sorted(c for c in REGROUPED if c not in INITIAL)


def test_reconnected_switch_gets_its_flows_back(initial):
    ctl, _ = initial
    expected = switch_table("as1")
    sh("ovs-vsctl", "del-controller", "as1")
    ofctl("del-flows", "as1")
    ofctl("add-flow", "as1", "priority=5,actions=drop")  # stale junk
    sh("ovs-vsctl", "set-controller", "as1", ctl.of_target)
    wait_for(
        lambda: switch_table("as1") == expected and "priority=5" not in ofctl("dump-flows", "as1"),
        20,
        "as1's flows to be restored",
    )  # a bound for a hang, not a speed claim (two busy cores)


def test_reconnected_ocs_gets_its_circuits_back(initial):
    ctl, client = initial
    client.put("/ocs/circuits", {"circuits": REGROUPED})
    sh("ovs-vsctl", "del-controller", "ocs1")
    ofctl("del-flows", "ocs1")
    sh("ovs-vsctl", "set-controller", "ocs1", ctl.of_target)
    wait_for(lambda: device_circuits() == sorted(REGROUPED), 20, "the OCS circuits to be restored")
    assert client.get("/events", limit=1)["events"][-1]["kind"] == "restore"


BAD = [
    ("port twice", {"circuits": [["ocs1:1", "ocs1:11"], ["ocs1:1", "ocs1:12"]]}, 400, "circuits[1]"),
    ("unknown port", {"circuits": [["ocs1:1", "ocs1:300"]]}, 400, "circuits[0]"),
    ("beyond port count", {"circuits": [["ocs1:1", "ocs1:999"]]}, 400, "circuits[0]"),
    ("GPU port to GPU port", {"circuits": [["ocs1:1", "ocs1:2"]]}, 400, "circuits[0]"),
    ("switch to switch", {"circuits": [["ocs1:11", "ocs1:21"]]}, 400, "circuits[0]"),
    ("unknown OCS", {"circuits": [["ocs9:1", "ocs1:11"]]}, 400, "circuits[0]"),
    ("not a pair", {"circuits": [["ocs1:1"]]}, 400, "circuits[0]"),
    ("wrong type", {"circuits": "ocs1:1-ocs1:11"}, 400, "circuits"),
    ("wrong item type", {"circuits": [[1, 11]]}, 400, "circuits[0][0]"),
    ("unknown key", {"circuits": [], "force": True}, 400, "force"),
    ("missing key", {}, 400, "circuits"),
    ("bad port syntax", {"circuits": [["ocs1-1", "ocs1:11"]]}, 400, "circuits[0]"),
]


@pytest.mark.parametrize("case", [b[0] for b in BAD])
def test_bad_requests_are_refused_and_change_nothing(initial, case):
    _, client = initial
    _, body, status, field = next(b for b in BAD if b[0] == case)
    before_events = len(client.get("/events", limit=1000)["events"])
    with pytest.raises(ApiError) as info:
        client.put("/ocs/circuits", body)
    assert info.value.status == status and info.value.field == field, info.value
    assert device_circuits() == sorted(INITIAL)
    assert client.get("/ocs/circuits")["circuits"] == sorted(INITIAL)
    assert len(client.get("/events", limit=1000)["events"]) == before_events


def test_missing_or_wrong_token_and_malformed_bodies(initial):
    ctl, _ = initial
    url = ctl.url + "/api/v1/ocs/circuits"
    body = json.dumps({"circuits": REGROUPED})
    r = requests.put(url, data=body, timeout=10)
    assert r.status_code == 401 and "Bearer" in r.json()["error"]["message"]
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert requests.put(url, data=body, headers={"Authorization": "Bearer nope"}, timeout=10).status_code == 401
    token = {"Authorization": "Bearer " + (ctl.state_dir / "token").read_text().strip()}
    r = requests.put(url, data="{not json", headers=token, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["field"] == "body"
    assert requests.put(url, data="", headers=token, timeout=10).status_code == 400
    assert requests.put(url, data="[1, 2]", headers=token, timeout=10).status_code == 400
    assert requests.post(url, data=body, headers=token, timeout=10).status_code == 405
    assert requests.get(ctl.url + "/api/v1/nothing", timeout=10).status_code == 404
    assert requests.get(ctl.url + "/api/v1/events?limit=-3", timeout=10).status_code == 400
    assert device_circuits() == sorted(INITIAL)


def test_openapi_and_cli(initial):
    ctl, client = initial
    doc = client.get("/openapi.json")
    assert doc["openapi"].startswith("3.") and "/ocs/circuits" in doc["paths"]
    from tests.integration.helpers import BIN, ROOT

    env_args = ["--url", ctl.url, "--token-file", str(ctl.state_dir / "token")]
    out = subprocess.run(
        [str(BIN / "optirack"), *env_args, "circuits", "--set", *(f"{a}={b}" for a, b in REGROUPED)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 0 and "applied: -4 +4 circuits" in out.stdout, out.stderr
    out = subprocess.run(
        [str(BIN / "optirack"), *env_args, "circuits", "--set", "ocs1:1=ocs1:2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert out.returncode == 1 and "circuits[0]" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([str(BIN / "optirack"), *env_args, "topology"], capture_output=True, text=True, cwd=ROOT)
    assert "gpu4   M40     srv4   198.18.0.6     ocs1:4    as1:4" in out.stdout
    assert device_circuits() == sorted(REGROUPED)
