"""Engines in the rack file (URLs, TLS, registry), the sample lab rack, and the container driver's
steps against a recording fake of the Docker SDK: sandbox, NIC helper, worker, and back."""
from __future__ import annotations

from pathlib import Path

import docker
import pytest
import yaml

from controller.core.emulated import RECEIVE_BUFFER
from controller.core.rack import RackError, load_rack, parse_rack
from controller.drivers.containers import ContainerDriver, container_name, sandbox_name
from controller.drivers.engines import Engines
from controller.jobs.ports import ContainerError, EngineDown, GpuContainer
from emulation.engines import engine_plans

ROOT = Path(__file__).resolve().parents[2]
PAPER = ROOT / "topologies" / "paper-testbed.yaml"
LAB = ROOT / "topologies" / "example-lab.yaml"


def paper() -> dict:
    return yaml.safe_load(PAPER.read_text())


def test_the_paper_rack_names_one_engine_per_server_with_tls():
    rack = load_rack(PAPER)
    assert [s.docker for s in rack.spec.servers] == [f"tcp://198.19.0.{i}:2376" for i in range(1, 5)]
    assert rack.spec.engines.tls is not None and rack.spec.engines.registry == "198.19.0.254:5000"
    assert [(p.server, p.ip, p.port) for p in engine_plans(rack)] == [
        (f"srv{i}", f"198.19.0.{i}", 2376) for i in range(1, 5)
    ]


def test_the_sample_lab_rack_is_valid():
    rack = load_rack(LAB)
    assert {s.docker.split("://")[0] for s in rack.spec.servers} == {"tcp", "ssh"}
    assert rack.engine_host("gpu03") == "10.10.0.13" and rack.interface("v1") == "ens1f0v0"


@pytest.mark.parametrize(
    "url, problem",
    [
        ("tcp://198.19.0.1", "names its port"),
        ("http://198.19.0.1:2376", "expected 'local'"),
        ("ssh://198.19.0.1", "names its user"),
        ("tcp://198.19.0.1:99999", "not a port number"),
        ("tcp://198.19.0.1:2376", "also the engine of server srv1"),
    ],
)
def test_bad_engine_urls_are_refused_by_field(url, problem):
    data = paper()
    data["servers"][1]["docker"] = url
    with pytest.raises(RackError) as info:
        parse_rack(data, "x.yaml")
    assert info.value.field == "servers[1].docker" and problem in info.value.problem


def test_a_tcp_engine_needs_tls_and_the_management_network_its_own_range():
    data = paper()
    del data["engines"]["tls"]
    with pytest.raises(RackError, match="servers.0..docker: .*needs engines.tls"):
        parse_rack(data, "x.yaml")
    data = paper()
    data["emulation"]["management"] = "198.18.0.0/23"
    with pytest.raises(RackError, match="emulation.management: .*overlaps network.subnet"):
        parse_rack(data, "x.yaml")


def test_the_emulation_refuses_engines_outside_its_management_network():
    data = paper()
    data["servers"][1]["docker"] = "tcp://10.0.0.2:2376"
    with pytest.raises(RackError, match=r"servers\[1\].docker: 10.0.0.2 is not a server address"):
        engine_plans(parse_rack(data, "x.yaml"))
    data = paper()
    data["engines"]["registry"] = "198.19.0.9:5000"
    with pytest.raises(RackError, match="engines.registry"):
        engine_plans(parse_rack(data, "x.yaml"))


# --- the driver against a fake Docker SDK ------------------------------------------------------
class FakeContainer:
    def __init__(self, engine, name, image, command, kwargs):
        self.engine, self.name, self.image, self.command, self.kwargs = engine, name, image, command, kwargs
        self.id = f"id-{name}"
        self.labels = kwargs.get("labels", {})
        self.status = "running"
        self.attrs = {
            "State": {"Pid": 4242 if name.endswith("-net") else 4343},
            "Config": {"Image": image},
            "Image": "sha",
        }

    def reload(self):
        pass

    def remove(self, force=False):
        self.engine.calls.append(("remove", self.name))
        self.engine.containers.by_name.pop(self.name, None)


class FakeContainers:
    def __init__(self, engine):
        self.engine, self.by_name = engine, {}

    def run(self, image, command=None, **kwargs):
        name = kwargs.get("name")
        if kwargs.get("network_mode") == "host":  # the NIC helper
            env = kwargs["environment"]
            self.last_run_labels = kwargs.get("labels", {})
            self.engine.calls.append(("helper", command[0], env.get("NIC"), env.get("NETNS"), env.get("PORT")))
            if self.engine.helper_fails:
                raise docker.errors.ContainerError("helper", 4, command, image, b"no interface gpu1 on this server")
            return b"ok\n"
        self.engine.calls.append(("run", name, kwargs.get("network_mode")))
        c = FakeContainer(self.engine, name, image, command, kwargs)
        self.by_name[name] = c
        return c

    def get(self, name):
        if name not in self.by_name:
            raise docker.errors.NotFound(name)
        return self.by_name[name]

    def list(self, all=True, filters=None, ignore_removed=False):
        return list(self.by_name.values())


class FakeImages:
    def get(self, ref):
        return object()

    def get_registry_data(self, ref):
        class Data:
            id = "sha256:" + "a" * 64

        return Data()


class FakeVolume:
    def __init__(self, volumes, name, labels):
        self.volumes, self.name, self.attrs = volumes, name, {"Labels": labels}

    def remove(self, force=False):
        self.volumes.by_name.pop(self.name, None)


class FakeVolumes:
    def __init__(self):
        self.by_name = {}

    def get(self, name):
        if name not in self.by_name:
            raise docker.errors.NotFound(name)
        return self.by_name[name]

    def create(self, name, labels=None):
        self.by_name[name] = FakeVolume(self, name, labels or {})
        return self.by_name[name]

    def list(self, filters=None):
        return list(self.by_name.values())


class FakeEngine:
    def __init__(self, helper_fails=False):
        self.calls, self.helper_fails = [], helper_fails
        self.containers, self.images, self.volumes = FakeContainers(self), FakeImages(), FakeVolumes()

    def ping(self):
        return True

    def info(self):
        return {"Runtimes": {"runc": {}}}


def _driver(helper_fails=False, down=()):
    rack = load_rack(PAPER)
    engines = {s: FakeEngine(helper_fails) for s in rack.servers}

    def make(server, timeout):
        if server in down:
            raise ConnectionRefusedError("connection refused")
        return engines[server]

    return ContainerDriver(rack, "optirack-worker:latest", Engines(rack, make)), engines


def _spec(gpu="gpu1", server="srv1"):
    return GpuContainer("job-1", gpu, server, 0, "M40", gpu, "198.18.0.1/24", ["--rank", "0"])


def test_a_restart_keeps_the_sandbox_and_its_nic_and_the_checkpoint_volume_until_the_job_ends():
    driver, engines = _driver()
    driver.start(_spec("gpu3", "srv3"))
    engine = engines["srv3"]
    worker = engine.containers.by_name[container_name("job-1", "gpu3")]
    assert worker.kwargs["volumes"] == {"optirack-ckpt-job-1": {"bind": "/checkpoints", "mode": "rw"}}
    assert engine.volumes.by_name["optirack-ckpt-job-1"].attrs["Labels"]["org.optirack.job"] == "job-1"
    engine.calls.clear()
    driver.start(_spec("gpu3", "srv3"), reuse=True)  # a restart from a checkpoint: only the worker is replaced
    assert engine.calls == [
        ("remove", container_name("job-1", "gpu3")),
        ("run", container_name("job-1", "gpu3"), f"container:id-{sandbox_name('job-1', 'gpu3')}"),
    ]
    assert driver.sweep("srv3", {"job-1"}, {("job-1", "gpu3")}) == [] and engine.volumes.by_name
    assert driver.sweep("srv3", {"job-1"}, set()) == ["gpu3"]  # the GPU left the job: its containers go
    assert engine.volumes.by_name  # the job goes on: its checkpoints stay
    assert driver.sweep("srv3", set()) == [] and not engine.volumes.by_name  # the job is over


def test_start_runs_sandbox_then_helper_add_then_a_worker_in_the_sandbox_on_the_gpus_own_engine():
    driver, engines = _driver()
    driver.start(_spec("gpu3", "srv3"))
    calls = engines["srv3"].calls
    assert calls[0] == ("run", sandbox_name("job-1", "gpu3"), "none")
    assert calls[1] == ("helper", "add", "gpu3", "/proc/4242/ns/net", "gpu3-port")
    assert calls[2] == ("run", container_name("job-1", "gpu3"), f"container:id-{sandbox_name('job-1', 'gpu3')}")
    worker = engines["srv3"].containers.by_name[container_name("job-1", "gpu3")]
    assert worker.image == "198.19.0.254:5000/optirack-worker@sha256:" + "a" * 64  # pulled by digest
    assert worker.kwargs["environment"]["OPTIRACK_GPU_ID"] == "gpu3"
    sandbox = engines["srv3"].containers.by_name[sandbox_name("job-1", "gpu3")]
    assert sandbox.kwargs["sysctls"] == {
        "net.ipv4.tcp_slow_start_after_idle": "0",  # emulated NIC: small queues too
        "net.ipv4.tcp_limit_output_bytes": str(2 * (9000 + 14)),
        "net.ipv4.tcp_early_retrans": "0",  # the lossless fabric (the default): no tail loss probes
        "net.ipv4.tcp_rmem": f"4096 {RECEIVE_BUFFER} {RECEIVE_BUFFER}",  # and a bounded window
        "net.ipv6.conf.all.disable_ipv6": "1",  # emulated NIC: the fabric carries IPv4 alone
        "net.ipv6.conf.default.disable_ipv6": "1",
    }
    assert all(e.calls == [] for s, e in engines.items() if s != "srv3")


def test_remove_gives_the_nic_back_before_the_containers_go_and_is_safe_to_repeat():
    driver, engines = _driver()
    driver.start(_spec())
    engines["srv1"].calls.clear()
    driver.remove("job-1", "gpu1", "srv1")
    calls = engines["srv1"].calls
    assert calls[0][:4] == ("helper", "del", "gpu1", "/proc/4242/ns/net")
    assert [c[1] for c in calls[1:]] == [container_name("job-1", "gpu1"), sandbox_name("job-1", "gpu1")]
    engines["srv1"].calls.clear()
    driver.remove("job-1", "gpu1", "srv1")  # nothing left: the helper still makes sure the NIC is home
    assert engines["srv1"].calls == [("helper", "del", "gpu1", "/proc/gone/ns/net", "gpu1-port")]


def _in_progress(name):
    import requests

    response = requests.Response()
    response.status_code = 409
    return docker.errors.APIError("409 Client Error", response=response,
                                  explanation=f"removal of container {name} is already in progress")


def test_a_container_another_caller_is_removing_is_waited_for_until_it_is_gone(monkeypatch):
    """Docker answers 409 to a second removal of a container: that is success once the container is gone."""
    driver, engines = _driver()
    driver.start(_spec())
    by_name = engines["srv1"].containers.by_name
    worker = by_name[container_name("job-1", "gpu1")]
    looks = []

    def removing(force=False):  # the other caller's removal: done after our second look
        raise _in_progress(worker.name)

    def get(name):
        looks.append(name)
        if name == worker.name and looks.count(name) > 2:
            by_name.pop(name, None)
        if name not in by_name:
            raise docker.errors.NotFound(name)
        return by_name[name]

    worker.remove = removing
    monkeypatch.setattr(engines["srv1"].containers, "get", get)
    driver.remove("job-1", "gpu1", "srv1")
    assert by_name == {} and looks.count(worker.name) == 3


def test_a_removal_under_way_that_never_ends_is_an_error_naming_the_container_and_engine(monkeypatch):
    from controller.drivers import containers

    monkeypatch.setattr(containers, "REMOVE_WAIT", 0.2)
    driver, engines = _driver()
    driver.start(_spec())
    worker = engines["srv1"].containers.by_name[container_name("job-1", "gpu1")]

    def stuck(force=False):
        raise _in_progress(worker.name)

    worker.remove = stuck
    with pytest.raises(ContainerError, match=f"container {worker.name} on the engine of srv1 is still being removed"):
        driver.remove("job-1", "gpu1", "srv1")


def test_another_conflict_is_not_taken_for_a_removal_under_way():
    import requests

    driver, engines = _driver()
    driver.start(_spec())
    worker = engines["srv1"].containers.by_name[container_name("job-1", "gpu1")]
    response = requests.Response()
    response.status_code = 409

    def refused(force=False):
        raise docker.errors.APIError("409", response=response, explanation="You cannot remove a paused container")

    worker.remove = refused
    with pytest.raises(docker.errors.APIError, match="paused"):
        driver.remove("job-1", "gpu1", "srv1")


def test_a_failed_nic_hand_over_undoes_the_sandbox_and_names_the_server():
    driver, engines = _driver(helper_fails=True)
    with pytest.raises(ContainerError, match="gpu1 on srv1: .*no interface gpu1"):
        driver.start(_spec())
    assert engines["srv1"].containers.by_name == {}


def test_an_engine_that_cannot_be_reached_is_down_with_the_reason():
    driver, _ = _driver(down={"srv2"})
    with pytest.raises(EngineDown, match=r"server srv2 \(tcp://198.19.0.2:2376\) is down: .*connection refused"):
        driver.check_engines(["srv1", "srv2"])
    assert set(driver.down_servers()) == {"srv2"}


def test_sweep_removes_only_jobs_that_are_over():
    driver, engines = _driver()
    driver.start(_spec("gpu1", "srv1"))
    driver.start(GpuContainer("job-2", "gpu5", "srv1", 1, "TitanV", "gpu5", "198.18.0.5/24", []))
    assert driver.sweep("srv1", keep_jobs={"job-2"}) == ["gpu1"]
    assert sorted(engines["srv1"].containers.by_name) == [
        container_name("job-2", "gpu5"),
        sandbox_name("job-2", "gpu5"),
    ]


def test_rack_check_names_the_server_and_the_cause():
    from controller.drivers.rackcheck import check_rack

    driver, engines = _driver(down={"srv4"})
    engines["srv2"].helper_fails = True  # its helper exits non-zero, saying why
    results = {r.server: r for r in check_rack(driver, gpus_emulated=True)}
    assert results["srv1"].ok and "GPUs emulated (gpu1, gpu5)" in results["srv1"].text
    assert (
        not results["srv2"].ok and "NIC helper" in results["srv2"].text and "no interface gpu1" in results["srv2"].text
    )
    assert not results["srv4"].ok and "engine unreachable" in results["srv4"].text and "refused" in results["srv4"].text
    assert results["srv4"].line().startswith("srv4") and " FAIL: " in results["srv4"].line()
    needs_gpus = {r.server: r for r in check_rack(driver, gpus_emulated=False)}
    assert not needs_gpus["srv1"].ok and "no NVIDIA runtime" in needs_gpus["srv1"].text


def test_an_engine_that_takes_the_connection_and_never_answers_is_named_hung():
    # A hung engine (its process stopped) still has its socket: the connection is made, the read times out. Whichever
    # detector sees it first (the engines' watch or the silent workers' probe), the loss says hung, not gone.
    class ReadTimeout(Exception):  # as requests names it
        pass

    rack = load_rack(PAPER)

    class Hung(FakeEngine):
        def ping(self):
            raise ReadTimeout("HTTPConnectionPool: Read timed out. (read timeout=3.0)")

    engines = {s: (Hung() if s == "srv3" else FakeEngine()) for s in rack.servers}
    driver = ContainerDriver(rack, "optirack-worker:latest", Engines(rack, lambda server, timeout: engines[server]))
    assert not driver.engines.ping("srv3") and driver.engines.ping("srv1")
    assert driver.down_servers()["srv3"].endswith("no answer within 3 s (hung)")


def test_a_sweep_removes_the_nic_helpers_an_earlier_controller_left_and_none_of_its_own_under_way():
    from controller.drivers.containers import LABEL_OWNER, LABEL_RACK, LABEL_ROLE

    driver, engines = _driver()
    engine = engines["srv1"]
    waited = []

    def helper(name, status, owner):
        labels = {LABEL_RACK: "paper", LABEL_ROLE: "helper"} | ({LABEL_OWNER: owner} if owner else {})
        c = FakeContainer(engine, name, "helper", ["add"], {"labels": labels})
        c.status = status
        c.wait = lambda timeout=None, c=c: waited.append((c.name, timeout)) or {"StatusCode": 0}
        engine.containers.by_name[name] = c

    earlier = "0123456789ab"  # a controller before this one, killed while its helpers ran
    helper("old-created", "created", earlier)  # never started
    helper("old-running", "running", earlier)  # its hand-over runs on: waited for, then removed
    helper("old-exited", "exited", earlier)
    helper("unlabelled", "created", None)  # a controller before owners were labelled
    helper("mine-created", "created", driver.instance)  # this controller's, under way: its call removes it
    helper("mine-running", "running", driver.instance)
    helper("mine-exited", "exited", driver.instance)  # ended and not removed: goes, as before
    helper("old-removing", "removing", earlier)  # another caller removes it
    assert driver.sweep("srv1", set()) == []
    assert sorted(engine.containers.by_name) == ["mine-created", "mine-running", "old-removing"]
    assert [w[0] for w in waited] == ["old-running"] and waited[0][1] > 0
    driver.nic("srv1", "add", {"NIC": "gpu1"})  # the helpers this controller runs carry its owner label
    assert engine.containers.last_run_labels[LABEL_OWNER] == driver.instance
