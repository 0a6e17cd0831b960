"""GPU containers on the emulated rack: each holds one GPU's NIC, workers all-reduce correctly,
and removing them returns every NIC and leaves nothing behind."""
from __future__ import annotations

import json

import docker
import pytest

from controller.core.rack import load_rack
from emulation import netns as ns
from controller.drivers.containers import ContainerDriver, GpuContainer, container_name, pinned_netns
from emulation.harness import Testbed
from emulation.nics import EmulatedNicHome
from tests.integration.helpers import PAPER, ping, sh, wait_for

RACK = load_rack(PAPER)
UNDER_AS1 = [["ocs1:1", "ocs1:11"], ["ocs1:2", "ocs1:12"], ["ocs1:3", "ocs1:13"], ["ocs1:4", "ocs1:14"],
             ["ocs1:5", "ocs1:21"], ["ocs1:6", "ocs1:22"]]


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    with Testbed(RACK, PAPER, tmp_path_factory.mktemp("bed")) as tb:
        tb.client.put("/ocs/circuits", {"circuits": UNDER_AS1})
        yield tb


@pytest.fixture
def driver(bed):
    d = ContainerDriver(RACK, "optirack-worker:latest", EmulatedNicHome(RACK))
    yield d
    for server in {s.name for s in RACK.spec.servers}:
        for c in d.containers(server):
            gpu = c.labels["org.optirack.gpu"]
            d.remove(c.labels["org.optirack.job"], gpu, server, gpu)


def _start(driver, job, gpus, *extra):
    master = RACK.addresses[gpus[0]][0]
    for rank, gpu in enumerate(gpus):
        g = RACK.gpus[gpu]
        cmd = ["--rank", str(rank), "--world-size", str(len(gpus)), "--master", master, "--wait-for-nic", "60",
               "--rate-scale", str(RACK.spec.emulation.rate_scale), *extra]
        driver.start(GpuContainer(job, gpu, RACK.server_of[gpu], g.index, g.model, gpu, f"{RACK.addresses[gpu][0]}/24", cmd))


def _results(driver, job, gpus) -> list[list[dict]]:
    client = docker.from_env()
    out = []
    for gpu in gpus:
        c = client.containers.get(container_name(job, gpu))
        status = c.wait(timeout=300)
        logs = c.logs().decode()
        assert status["StatusCode"] == 0, logs[-2000:]
        out.append([json.loads(line) for line in logs.splitlines() if line.startswith("{")])
    return out


def _root_links() -> set[str]:
    return {line.split(":")[1].strip().split("@")[0] for line in sh("ip", "-o", "link").splitlines()}


def _check_all_home(driver):
    for gpu in RACK.gpus:
        home = f"optirack-{RACK.server_of[gpu]}"
        assert ns.has_link(gpu, home), f"{gpu} is not back in {home}"
        assert RACK.addresses[gpu][0] in sh("ip", "-n", home, "-o", "addr", "show", "dev", gpu)
        assert not ns.exists(pinned_netns(gpu))
    assert docker.from_env().containers.list(all=True, filters={"label": "org.optirack.rack"}) == []


@pytest.mark.parametrize("gpus", [["gpu1", "gpu2"], ["gpu1", "gpu2", "gpu3", "gpu4"]], ids=["2 GPUs", "4 GPUs"])
def test_profile_workers_all_reduce_correctly(driver, gpus):
    links = _root_links()
    _start(driver, "t", gpus, "--iterations", "3", "--workload", "resnet50", "--compute-seconds", "0.05")
    client = docker.from_env()
    for gpu in gpus:  # each container sees only loopback and its own NIC, and its own GPU id
        c = client.containers.get(container_name("t", gpu))
        names = sorted(line.split(":")[1].strip().split("@")[0] for line in
                       c.exec_run(["ip", "-o", "link"]).output.decode().splitlines())
        assert names == sorted(["lo", gpu])
        env = c.exec_run(["sh", "-c", "echo $OPTIRACK_GPU_ID $OPTIRACK_GPU_MODEL"]).output.decode().split()
        assert env == [gpu, RACK.gpus[gpu].model]
        assert not ns.has_link(gpu, f"optirack-{RACK.server_of[gpu]}")  # gone from its server
    results = _results(driver, "t", gpus)
    for rank, records in enumerate(results):
        its = [r for r in records if r["event"] == "iteration"]
        assert len(its) == 3 and all(r["bytes"] == round(25_557_032 * RACK.spec.emulation.rate_scale) * 4 for r in its)
        done = records[-1]
        assert done["event"] == "done" and done["check"] == "ok" and done["rank"] == rank
    for gpu in gpus:
        driver.remove("t", gpu, RACK.server_of[gpu], gpu)
    _check_all_home(driver)
    assert _root_links() == links  # no veth gained or lost
    assert ping("optirack-srv1", RACK.addresses["gpu2"][0], src=RACK.addresses["gpu1"][0])


def test_real_model_trains_in_containers(driver):
    gpus = ["gpu5", "gpu6"]
    _start(driver, "r", gpus, "--mode", "real", "--iterations", "3", "--batch", "8")
    results = _results(driver, "r", gpus)
    assert all(r[-1]["check"] == "ok" for r in results)
    losses = [x["loss"] for x in results[0] if x["event"] == "iteration"]
    assert len(losses) == 3
    for gpu in gpus:
        driver.remove("r", gpu, RACK.server_of[gpu], gpu)
    _check_all_home(driver)


def test_a_crashed_container_gives_its_nic_back(driver):
    _start(driver, "c", ["gpu1", "gpu2"], "--iterations", "1000", "--compute-seconds", "1")
    docker.from_env().containers.get(container_name("c", "gpu1")).kill()
    # the namespace is pinned: the NIC survived its container and goes home
    driver.remove("c", "gpu1", "srv1", "gpu1")
    # worse: the namespace is gone too, taking the NIC and its OCS port with it
    docker.from_env().containers.get(container_name("c", "gpu2")).kill()
    ns.delete(pinned_netns("gpu2"))
    wait_for(lambda: not ns.has_link("ocs1-p2", None), 10, "the kernel to destroy the namespace and the veth")
    driver.remove("c", "gpu2", "srv2", "gpu2")  # recreates the NIC and its OCS port
    _check_all_home(driver)
    assert sh("ovs-vsctl", "get", "interface", "ocs1-p2", "ofport").strip() == "2"
    assert ping("optirack-srv1", RACK.addresses["gpu2"][0], src=RACK.addresses["gpu1"][0])


def test_failed_start_changes_nothing(driver):
    bad = ContainerDriver(RACK, "optirack-no-such-image:latest", EmulatedNicHome(RACK))
    from controller.drivers.containers import ContainerError
    with pytest.raises(ContainerError, match="cannot start the container of gpu3"):
        bad.start(GpuContainer("f", "gpu3", "srv3", 0, "M40", "gpu3", "198.18.0.4/24", ["--help"]))
    _check_all_home(driver)
