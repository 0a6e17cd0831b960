"""GPU containers on the emulated rack's own engines: each worker runs on its server's engine and
holds exactly its GPU's NIC (moved by the CNI plugin in a helper container), workers all-reduce
correctly through the shaped ports, and removing them gives every NIC back."""
from __future__ import annotations

import json

import pytest

from controller.core.emulated import RECEIVE_BUFFER, nic_port
from controller.core.rack import load_rack
from controller.drivers.containers import ContainerDriver, container_name, sandbox_name
from controller.jobs.ports import ContainerError, GpuContainer
from emulation import netns as ns
from emulation.shaping import WINDOW_SEGMENTS
from tests.integration.helpers import PAPER, ping, sh, wait_for, worker_image

RACK = load_rack(PAPER)
UNDER_AS1 = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:13"], ["ocs1:4", "ocs1:14"],
             ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]]


@pytest.fixture
def driver(bed):
    """The container driver itself, no controller in the way; every GPU under as1 (one ring, one switch).
    The `bed` fixture removes what a test leaves, by label, NICs handed back first."""
    bed.client.put("/ocs/circuits", {"circuits": UNDER_AS1})
    d = ContainerDriver(RACK, worker_image())
    yield d
    for server in RACK.servers:
        d.sweep(server, keep_jobs=set())


def _start(driver, job, gpus, *extra):
    master = RACK.addresses[gpus[0]][0]
    for rank, gpu in enumerate(gpus):
        g = RACK.gpus[gpu]
        cmd = ["--rank", str(rank), "--world-size", str(len(gpus)), "--master", master, "--wait-for-nic", "60",
               "--rate-scale", str(RACK.spec.emulation.rate_scale), *extra]
        driver.start(
            GpuContainer(job, gpu, RACK.server_of[gpu], g.index, g.model, gpu, f"{RACK.addresses[gpu][0]}/24", cmd)
        )


def _results(driver, job, gpus) -> list[list[dict]]:
    out = []
    for gpu in gpus:
        c = driver.client(RACK.server_of[gpu]).containers.get(container_name(job, gpu))
        status = c.wait(timeout=300)
        logs = c.logs().decode()
        assert status["StatusCode"] == 0, logs[-2000:]
        out.append([json.loads(line) for line in logs.splitlines() if line.startswith("{")])
    return out


def _check_all_home(driver):
    for gpu in RACK.gpus:
        home = f"optirack-{RACK.server_of[gpu]}"
        assert ns.has_link(gpu, home), f"{gpu} is not back in {home}"
        assert RACK.addresses[gpu][0] in sh("ip", "-n", home, "-o", "addr", "show", "dev", gpu)
    for server in RACK.servers:  # asked of each engine
        assert driver.workers(server) == [], server


def _sent_bytes(netns: str | None, dev: str) -> int:
    out = sh("tc", *(["-n", netns] if netns else []), "-s", "class", "show", "dev", dev)
    return sum(int(line.split()[1]) for line in out.splitlines() if line.strip().startswith("Sent"))


@pytest.mark.parametrize("gpus", [["gpu1", "gpu2"], ["gpu1", "gpu2", "gpu3", "gpu4"]], ids=["2 GPUs", "4 GPUs"])
def test_profile_workers_all_reduce_correctly(driver, gpus):
    port_bytes = {g: _sent_bytes(f"optirack-{RACK.server_of[g]}", nic_port(g)) for g in gpus}
    _start(driver, "t", gpus, "--iterations", "3", "--workload", "resnet50", "--compute-seconds", "0.05")
    for gpu in gpus:  # each worker is on its own server's engine, and sees only loopback and its own NIC
        server = RACK.server_of[gpu]
        c = driver.client(server).containers.get(container_name("t", gpu))
        addrs = c.exec_run(["ip", "-o", "-4", "addr"]).output.decode().splitlines()
        assert sorted(line.split()[1] for line in addrs) == sorted(["lo", gpu])
        assert f"{RACK.addresses[gpu][0]}/24" in next(line for line in addrs if line.split()[1] == gpu)
        env = c.exec_run(["sh", "-c", "echo $OPTIRACK_GPU_ID $OPTIRACK_GPU_MODEL"]).output.decode().split()
        assert env == [gpu, RACK.gpus[gpu].model]
        assert not ns.has_link(gpu, f"optirack-{server}")  # gone from its server
        route = c.exec_run(["ip", "route"]).output.decode()  # the lossless fabric's bound on each flow's window
        assert f"cwnd lock {WINDOW_SEGMENTS}" in route and f"initcwnd {WINDOW_SEGMENTS}" in route, route
        sysctl = c.exec_run(["cat", "/proc/sys/net/ipv4/tcp_slow_start_after_idle"]).output.decode().strip()
        assert sysctl == "0"
        rmem = c.exec_run(["cat", "/proc/sys/net/ipv4/tcp_rmem"]).output.decode().split()  # and on every first
        assert rmem == ["4096", str(RECEIVE_BUFFER), str(RECEIVE_BUFFER)]  # connection, where no cwnd lock applies
        for other in RACK.servers:
            if other != server:
                assert driver.client(other).containers.list(all=True, filters={"name": container_name("t", gpu)}) == []
    results = _results(driver, "t", gpus)
    for rank, records in enumerate(results):
        its = [r for r in records if r["event"] == "iteration"]
        assert len(its) == 3 and all(r["bytes"] == round(25_557_032 * RACK.spec.emulation.rate_scale) * 4 for r in its)
        done = records[-1]
        assert done["event"] == "done" and done["check"] == "ok" and done["rank"] == rank
    for gpu in gpus:  # what the NIC sent went through its port's shaper, though the NIC was in a container
        assert _sent_bytes(f"optirack-{RACK.server_of[gpu]}", nic_port(gpu)) - port_bytes[gpu] > 3 * 12_000
        driver.remove("t", gpu, RACK.server_of[gpu])
    _check_all_home(driver)
    assert ping("optirack-srv1", RACK.addresses["gpu2"][0], src=RACK.addresses["gpu1"][0])


def test_real_model_trains_in_containers(driver):
    gpus = ["gpu5", "gpu6"]
    _start(driver, "r", gpus, "--mode", "real", "--iterations", "3", "--batch", "8")
    results = _results(driver, "r", gpus)
    assert all(r[-1]["check"] == "ok" for r in results)
    assert len([x["loss"] for x in results[0] if x["event"] == "iteration"]) == 3
    for gpu in gpus:
        driver.remove("r", gpu, RACK.server_of[gpu])
    _check_all_home(driver)


def test_a_nic_outlives_its_worker_and_a_dead_sandbox_costs_only_the_nic(driver):
    _start(driver, "c", ["gpu1", "gpu2"], "--iterations", "1000", "--compute-seconds", "1")
    srv1, srv2 = driver.client("srv1"), driver.client("srv2")
    srv1.containers.get(container_name("c", "gpu1")).kill()  # the worker dies: the sandbox keeps the NIC
    assert not ns.has_link("gpu1", "optirack-srv1")
    driver.remove("c", "gpu1", "srv1")
    # worse: the sandbox dies, and the NIC (a macvlan) with its namespace; its port and the OCS port stay
    srv2.containers.get(sandbox_name("c", "gpu2")).kill()
    srv2.containers.get(container_name("c", "gpu2")).kill()
    wait_for(lambda: srv2.containers.get(sandbox_name("c", "gpu2")).status == "exited", 10, "the sandbox to die")
    assert ns.has_link(nic_port("gpu2"), "optirack-srv2") and ns.has_link("ocs1-p2", None)
    driver.remove("c", "gpu2", "srv2")  # the helper recreates the NIC on its port
    _check_all_home(driver)
    assert ping("optirack-srv1", RACK.addresses["gpu2"][0], src=RACK.addresses["gpu1"][0])


def test_failed_start_changes_nothing(driver):
    bad = ContainerDriver(RACK, "optirack-no-such-image:latest")
    with pytest.raises(ContainerError, match="cannot start the container of gpu3 on srv3"):
        bad.start(GpuContainer("f", "gpu3", "srv3", 0, "M40", "gpu3", "198.18.0.4/24", ["--help"]))
    _check_all_home(driver)


def test_two_removals_of_one_gpu_at_once_both_succeed_and_the_nic_is_home(driver):
    """Removal is safe to repeat and to race: the engine's 409 for a container another caller is removing, and the
    helper's del of a NIC already handed back, are success once the containers are gone."""
    import threading

    _start(driver, "r", ["gpu1", "gpu2"], "--iterations", "1000", "--compute-seconds", "1")
    errors: list[BaseException] = []

    def remove() -> None:
        try:
            driver.remove("r", "gpu1", "srv1")
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=remove) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    driver.remove("r", "gpu1", "srv1")  # once more, with nothing left
    driver.remove("r", "gpu2", "srv2")
    _check_all_home(driver)


def test_the_nic_helpers_del_raced_with_itself_always_succeeds_and_leaves_one_address():
    """The helper's `del` for an emulated NIC that died with its namespace, run twice at once, 25 times, in a
    network namespace of the test's own: both succeed and the NIC ends home with exactly its address and route.
    It once flushed the addresses before adding its own, so one del could remove the address the other had just
    added and that one's `ip route ... src` failed ("Invalid prefsrc address", exit 2)."""
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "containers" / "helper" / "optirack-nic"
    name = f"optirack-t-nic-{os.getpid()}"
    sh("ip", "netns", "add", name)
    try:
        sh("ip", "netns", "exec", name, "ip", "link", "add", "port0", "type", "veth", "peer", "name", "port0p")
        sh("ip", "netns", "exec", name, "ip", "link", "set", "port0", "up")
        env = {**os.environ, "NIC": "nic0", "NETNS": f"/run/netns/{name}-gone", "CIDR": "10.9.0.2/24", "ID": "t",
               "PORT": "port0", "MAC": "02:00:00:00:09:02", "TABLE": "109", "SUBNET": "10.9.0.0/24"}
        failures = []
        for _ in range(25):
            subprocess.run(["ip", "netns", "exec", name, "ip", "link", "del", "nic0"], capture_output=True)
            procs = [subprocess.Popen(["ip", "netns", "exec", name, "sh", str(script), "del"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                     for _ in range(2)]
            failures += [(p.returncode, out) for p in procs for out, _ in [p.communicate(timeout=30)]
                         if p.returncode != 0]
        assert failures == []
        addrs = sh("ip", "netns", "exec", name, "ip", "-o", "-4", "addr", "show", "dev", "nic0")
        assert [line.split()[3] for line in addrs.splitlines()] == ["10.9.0.2/24"]
        assert "src 10.9.0.2" in sh("ip", "netns", "exec", name, "ip", "route", "show", "table", "109")
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
