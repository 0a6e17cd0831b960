"""Helpers shared by the integration tests: the shared testbed and its cleanup, a controller
process, polling, OVS queries and flow counters."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from emulation import harness
from emulation.harness import free_port, wait_for  # noqa: F401  (re-exported for the tests)

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PAPER = ROOT / "topologies" / "paper-testbed.yaml"


def sh(*cmd: str, check: bool = True, **kw) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


class ControllerProcess(harness.ControllerProcess):
    """The controller on free ports for the paper rack (or `rack`), state under `tmp_path`."""

    def __init__(self, tmp_path: Path, rack: Path = PAPER, extra: list[str] | None = None):
        super().__init__(tmp_path, rack, extra)


RACK8 = ROOT / "topologies" / "rack8-3as.yaml"


def optirack_rack(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "optirack-rack"), *args], capture_output=True, text=True, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"optirack-rack {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def ofctl(*args: str) -> str:
    return sh("ovs-ofctl", "-O", "OpenFlow13", *args)


def set_circuits_by_hand(ocs: str, pairs: list[tuple[int, int]]) -> None:
    ofctl("del-flows", ocs)
    for a, b in pairs:
        ofctl("add-flow", ocs, f"priority=100,in_port={a},actions=output:{b}")
        ofctl("add-flow", ocs, f"priority=100,in_port={b},actions=output:{a}")


def install_forwarding_by_hand(rack, circuits) -> None:
    """Flows from controller.core.forwarding (and the aggregators'), written with ovs-ofctl (no controller)."""
    from controller.core.aggregators import tables

    for switch, table in tables(rack, circuits).items():
        ofctl("del-flows", switch)
        for ip, port in table.items():
            ofctl("add-flow", switch, f"priority=10,ip,nw_dst={ip},actions=output:{port}")
            ofctl("add-flow", switch, f"priority=10,arp,arp_tpa={ip},actions=output:{port}")


def ping(netns: str, dst: str, count: int = 2, src: str | None = None) -> bool:
    """Ping from a namespace; `src` picks the sending NIC where a server holds several."""
    return subprocess.run(["ip", "netns", "exec", netns, "ping", "-c", str(count), "-i", "0.2", "-W", "1",
                           *(["-I", src] if src else []), dst],
                          capture_output=True).returncode == 0


def iperf_mbps(server_ns: str, server_ip: str, client_ns: str, client_ip: str, seconds: int = 4,
               port: int = 5201) -> float:
    """TCP goodput from client to server in Mbit/s, as the receiver counted it."""
    import json

    server = subprocess.Popen(
        ["ip", "netns", "exec", server_ns, "iperf3", "-s", "-1", "-B", server_ip, "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                subprocess.run(
                    ["ip", "netns", "exec", server_ns, "ss", "-ltn", f"sport = :{port}"], capture_output=True, text=True
                ).stdout.count("LISTEN")
                > 0
            ),
            5,
            "iperf3 -s",
        )
        out = sh(
            "ip",
            "netns",
            "exec",
            client_ns,
            "iperf3",
            "-c",
            server_ip,
            "-B",
            client_ip,
            "-p",
            str(port),
            "-t",
            str(seconds),
            "-O",
            "1",
            "-J",
            timeout=seconds + 20,
        )
        return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
    finally:
        server.wait(10)


def worker_image() -> str:
    """The worker image the tests run (OPTIRACK_IMAGE_TAG picks another tag, as `make image` does)."""
    from containers.image import WORKER_IMAGE

    return WORKER_IMAGE


def our_containers() -> dict[str, list]:
    """Containers of any optirack rack on this host's engine and on every emulated server's engine."""
    import docker

    from controller.core.rack import load_rack
    from controller.drivers.containers import LABEL_RACK
    from controller.drivers.engines import engine_client
    from emulation.rack import RackState

    found = {"local": docker.from_env().containers.list(all=True, ignore_removed=True, filters={"label": LABEL_RACK})}
    state = RackState.load()
    if state and state.engines:
        rack = load_rack(state.rack_file)
        for e in state.engines:
            found[e["server"]] = engine_client(rack, e["server"], 30).containers.list(
                all=True, ignore_removed=True, filters={"label": LABEL_RACK}
            )
    return {k: [Named(c) for c in v] for k, v in found.items() if v}


def assert_no_containers(within: float = 60.0) -> None:
    """No optirack container left on any engine, once the controller's clean-up after a job's end is over: a job is
    reported ended before a warm spare of it that was still starting goes (controller/jobs/warm.py removes it when
    its start returns), seconds on a loaded host; one still there after `within` s is left over."""
    try:
        wait_for(lambda: not our_containers(), within, "the controller to remove every container", interval=0.5)
    except TimeoutError:
        pass  # the assertion names them
    assert our_containers() == {}, "containers left on some engine"


class Named:
    """A container as an assertion shows it: its name, status and our labels (not only its id)."""

    def __init__(self, c):
        self.c = c

    def __repr__(self) -> str:
        labels = {k.rsplit(".", 1)[-1]: v for k, v in (self.c.labels or {}).items() if k.startswith("org.optirack")}
        return f"<{self.c.name} {self.c.status} {labels}>"

    def __getattr__(self, name):
        return getattr(self.c, name)


def rack_cli(*args: str) -> str:
    """`optirack-rack ARGS` as a user runs it; its output (the test fails naming it if it exits with an error)."""
    return optirack_rack(*args).stdout


def seen_up(client, *servers: str) -> None:
    """Wait until the controller shows each server's engine up: it does once it has swept what the server ran before
    (its own helper containers for that run meanwhile, which a look at the engines would count)."""
    wait_for(lambda: all(client.get("/topology")["servers"][s]["engine"]["up"] for s in servers), 30,
             f"{', '.join(servers)} seen up, swept")


def wait_job(client, job_id: str, timeout: float = 300) -> dict:
    wait_for(lambda: client.get(f"/jobs/{job_id}")["job"]["state"] not in ("pending", "configuring", "running",
                                                                             "recovering"),
             timeout, f"{job_id} to end")
    return client.get(f"/jobs/{job_id}")["job"]
