"""Bring an emulated rack up, report on it, and take it down leaving nothing behind.

Mininet builds the rack; then each server's network namespace is pinned with
`ip netns attach optirack-<server>` and Mininet's helper shells are ended, so the rack lives on
in the kernel and in Open vSwitch alone, with no process to crash: the controller and the
container driver reach a server's namespace by that name. What the rack made is written to a
state file and every bridge carries the label `external_ids:optirack-rack`; `down` removes
exactly those things, and is safe to repeat or to run after a crash.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from controller.core.emulated import NETNS_PREFIX, RUN_DIR, STATE_FILE, netns_of, nic_plans
from controller.core.rack import Rack
from emulation import aggregators, engine_procs, engines, nics, ovs, registry, slurm
from emulation import netns as ns
from emulation.topo import RackTopo, check_emulable, downlink_patches, port_mtus

CONTAINER_LABEL = "org.optirack.rack"


@dataclass
class RackState:
    """What one rack made; written before the rack exists so a crash can be cleaned up."""

    name: str
    rack_file: str
    controller: str
    bridges: list[str]
    root_intfs: list[str]
    namespaces: dict[str, str]  # server -> netns name
    nics: dict[str, dict] = field(default_factory=dict)  # gpu -> NicPlan fields
    pids: list[int] = field(default_factory=list)
    engines: list[dict] = field(default_factory=list)  # EnginePlan fields of the engines started
    registry: str | None = None  # the registry this rack started (ADDR:PORT)
    images: dict[str, str] = field(default_factory=dict)  # image name -> repo@digest the engines hold
    netconf: dict[str, str] = field(default_factory=dict)  # OCS -> run directory of its emulated NETCONF server
    netconf_users: list[str] = field(default_factory=list)  # the login accounts rack-up made for their SSH servers
    aggregators: dict[str, dict] = field(default_factory=dict)  # switch -> its aggregator's netns, port, PID, address
    status: str = "building"
    up_seconds: float = 0.0

    @staticmethod
    def path() -> Path:
        return RUN_DIR / STATE_FILE

    def save(self) -> None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.path().with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(self.path())

    @classmethod
    def load(cls) -> RackState | None:
        try:
            return cls(**json.loads(cls.path().read_text()))
        except (OSError, ValueError, TypeError):
            return None


class RackConflict(RuntimeError):
    """Something not made by optirack is in the way."""


def _log(msg: str) -> None:
    print(msg, flush=True)


def _check_conflicts(rack: Rack, topo: RackTopo) -> None:
    ours = ovs.rack_bridges()
    for name in topo.switches():
        if name in ovs.bridges() and name not in ours:
            raise RackConflict(f"an Open vSwitch bridge named {name!r} exists and was not made by optirack; "
                               "rename the device in the rack file or remove that bridge")
    for _, _, info in topo.links(withInfo=True):
        for key in ("intfName1", "intfName2"):
            intf = info[key]
            node = info["node1" if key == "intfName1" else "node2"]
            if node in topo.switches() and ns.has_link(intf, None):
                raise RackConflict(f"an interface named {intf!r} already exists in the root namespace")


def _state_for(rack: Rack, topo: RackTopo, controller: str) -> RackState:
    root_intfs = []
    for _, _, info in topo.links(withInfo=True):
        for end in ("1", "2"):
            if info[f"node{end}"] in topo.switches():
                root_intfs.append(info[f"intfName{end}"])
    plans = engines.engine_plans(rack)
    return RackState(name=rack.name, rack_file=str(rack.source), controller=controller, bridges=list(topo.switches()),
                     root_intfs=sorted(root_intfs), namespaces={h: netns_of(h) for h in topo.hosts()},
                     nics={n.gpu: asdict(n) for n in nic_plans(rack)}, engines=[asdict(e) for e in plans],
                     registry=rack.spec.engines.registry if plans else None)


def _switch_class(rack_name: str):
    from mininet.node import OVSSwitch

    class RackSwitch(OVSSwitch):
        """An OVS userspace bridge, OpenFlow 1.3 only, fail-mode secure, labelled as ours."""

        def start(self, controllers):
            super().start(controllers)
            self.vsctl("--", "set", "bridge", self.name, f"external-ids:{ovs.RACK_LABEL}={rack_name}")

    # batch: all bridges in ovs-vsctl runs of our own; one Mininet shell line would be cut at
    # the terminal's 4095 characters, silently dropping ports of a large bridge.
    return partial(RackSwitch, datapath="user", protocols="OpenFlow13", failMode="secure", reconnectms=1000,
                   batch=True)


def _controller_class():
    from mininet.node import RemoteController

    class RackController(RemoteController):
        """Mininet's remote controller, without its check that the controller listens: that check reads what a
        telnet to the OpenFlow port prints, and a controller that does listen answers with its binary HELLO, which
        Mininet decodes as UTF-8 and fails on (one random transaction id in a few). `up` checks the switches'
        connections itself (wait_connected)."""

        def checkListening(self):
            return None

    return RackController


def build(rack: Rack, controller: str = "127.0.0.1:6653", log_level: str = "warning"):
    """Build and start the rack with Mininet; returns the running `Mininet` and the state."""
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.node import Host

    check_emulable(rack)
    setLogLevel(os.environ.get("OPTIRACK_MININET_LOG", log_level))
    topo = RackTopo(rack=rack)
    _check_conflicts(rack, topo)
    state = _state_for(rack, topo, controller)
    state.save()  # before anything exists, so that `down` can clean up after a failure here
    host, port = controller.rsplit(":", 1)
    net = Mininet(topo=topo, switch=_switch_class(rack.name), host=Host, controller=None, build=False,
                  autoSetMacs=False, autoStaticArp=False, waitConnected=False)
    try:  # a failure from here on ends the nodes' shells made so far (`down` knows the hosts' only once saved)
        net.addController(_controller_class()("c0", ip=host, port=int(port)))
        net.build()
    except BaseException:
        end_shells(net)
        raise
    state.pids = [h.pid for h in net.hosts]
    state.save()
    net.start()
    ovs.vsctl(*downlink_patches(rack), *port_mtus(rack))
    for h in net.hosts:
        h.cmd("ip", "link", "set", "dev", "lo", "up")
        ns.attach(netns_of(h.name), h.pid)
        nics.prepare_server(netns_of(h.name), rack.spec.emulation.fabric)
    for nic in nic_plans(rack):
        nics.make(nic, rack)
    for a, b in rack.spec.circuits:
        for x, y in ((a, b), (b, a)):
            flow = f"cookie={ovs.circuit_cookie(x.port):#x},priority=100,in_port={x.port},actions=output:{y.port}"
            ovs.ofctl("add-flow", a.device, flow)
    return net, state


def end_shells(net) -> None:
    """End the helper shells Mininet started for its nodes, and wait until they are gone."""
    nodes = net.hosts + net.switches + net.controllers
    shells = [n.shell for n in nodes if n.shell]
    for node in nodes:
        node.terminate()  # SIGHUP to the shell's process group
    deadline = time.monotonic() + 5
    for shell in shells:
        while shell.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if shell.poll() is None:
            shell.kill()  # our own child, which ignored SIGHUP
            shell.wait()


def up(rack: Rack, controller: str = "127.0.0.1:6653", wait_connected: float = 5.0, with_slurm: bool = False,
       slurm_hook: slurm.Hook | None = None) -> RackState:
    """Build the rack, pin it in the kernel, end Mininet's shells, and return its state; with Slurm
    (emulation/slurm.py) on it if asked, its slurmctld hooks running `slurm_hook`."""
    t0 = time.monotonic()
    check_emulable(rack)  # refuse a bad file before touching a rack that may be up
    if RackState.load() or ovs.rack_bridges():
        _log("a rack (or what is left of one) is up: taking it down first")
        down()
    try:
        net, state = build(rack, controller)
    except BaseException:
        _log("rack-up failed: removing what was made")
        down(quiet=True)
        raise
    end_shells(net)  # the rack stays: bridges in OVS, namespaces pinned by name
    state.pids = []
    try:
        aggregators.start(rack, state)
        start_netconf(rack, state)
        _start_engines(rack, state)
        if with_slurm:
            if not state.engines:
                raise slurm.SlurmError("Slurm on the emulated rack needs its management network: tcp:// engines")
            slurm.start(rack, slurm_hook, log=_log)
    except BaseException:
        _log("rack-up failed while starting the aggregators, the NETCONF OCS, the engines or Slurm: removing what "
             "was made")
        down(quiet=True)
        raise
    state.status = "up"
    state.up_seconds = round(time.monotonic() - t0, 2)
    state.save()
    deadline = time.monotonic() + wait_connected
    while time.monotonic() < deadline and not all(ovs.controller_connected(b) for b in state.bridges):
        time.sleep(0.2)
    return state


def start_netconf(rack: Rack, state: RackState) -> None:
    """For each OCS the rack file drives by NETCONF: netconfd holding the starting circuits, and the agent that
    makes the OCS bridge follow it (emulation.netconf_ocs), their PID files in a run directory of the rack's. Over
    SSH (`ssh://USER@127.0.0.1:PORT?known_hosts=FILE&keyfile=FILE`): our sshd in front of netconfd, the user made
    if missing (and removed at rack-down), the key pair made at `keyfile`, the host key written to `known_hosts`."""
    from controller.drivers.netconf_transport import parse_address
    from emulation import netconf_ocs, netconf_ssh

    for o in rack.spec.ocs:
        if o.driver != "netconf":
            continue
        addr = parse_address(o.address)
        ssh = addr.transport == "ssh"
        named = addr.user and addr.known_hosts and addr.keyfile
        if addr.host not in ("127.0.0.1", "localhost") or (ssh and not named):
            raise RackConflict(f"ocs {o.name}: the emulated NETCONF OCS listens on loopback: give it 'address: "
                               "ssh://USER@127.0.0.1:PORT?known_hosts=FILE&keyfile=FILE' or "
                               f"'tcp-ncx://127.0.0.1:PORT' (not {o.address!r})")
        if netconf_ocs.listening(addr.port):
            raise RackConflict(f"ocs {o.name}: something already listens on 127.0.0.1:{addr.port}")
        run = RUN_DIR / f"netconf-{o.name}"
        state.netconf[o.name] = str(run)
        if ssh and netconf_ssh.ensure_user(addr.user):
            state.netconf_users.append(addr.user)
        state.save()
        starting = {(min(a.port, b.port), max(a.port, b.port)) for a, b in rack.spec.circuits if a.device == o.name}
        if ssh:
            run.mkdir(parents=True, exist_ok=True)
            key = netconf_ssh.keygen(Path(addr.keyfile), f"optirack controller to {o.name}")
            netconf_ocs.start(run, 0, o.name, o.switching_time_ms, startup=starting,
                              ssh={"port": addr.port, "user": addr.user, "client_keys": [key]})
            netconf_ssh.write_known_hosts(Path(addr.known_hosts), addr.host, addr.port, run / "ssh_host_ed25519_key")
            _log(f"  {o.name}: NETCONF over SSH on 127.0.0.1:{addr.port} as {addr.user} (sshd, netconfd + agent)")
        else:
            netconf_ocs.start(run, addr.port, o.name, o.switching_time_ms, startup=starting)
            _log(f"  {o.name}: NETCONF on 127.0.0.1:{addr.port} (netconfd + agent)")


def _stop_netconf(state: RackState) -> int:
    from emulation import netconf_ocs, netconf_ssh

    ended = 0
    for run in state.netconf.values():
        ended += netconf_ocs.stop(Path(run))
        netconf_ocs.forget(Path(run))
    for user in state.netconf_users:
        netconf_ssh.remove_user(user)
    return ended


def _start_engines(rack: Rack, state: RackState) -> None:
    """Management network, certificates, registry, one engine per server, images on every engine."""
    plans = [engines.EnginePlan(**e) for e in state.engines]
    if not plans:
        return
    t0 = time.monotonic()
    reg = rack.spec.engines.registry
    engines.make_management(rack, plans)
    engines.make_certificates(rack, plans, reg.rsplit(":", 1)[0] if reg else None)
    for p in plans:
        engines.start(rack, p)
    if reg:
        registry.start(rack)
        state.images = _push_images(reg)
        state.save()
    engines.start_all_wait(rack, plans, _log)
    if state.images:
        engines.pull_all(rack, plans, state.images, _log)
    _log(f"  {len(plans)} engines ready in {time.monotonic() - t0:.1f} s")


def _push_images(reg: str) -> dict[str, str]:
    import docker

    from containers import image

    client = docker.from_env(timeout=600)
    image.ensure_helper(client)
    try:
        client.images.get(image.WORKER_IMAGE)
    except docker.errors.ImageNotFound:
        raise engines.EngineError(
            f"no {image.WORKER_IMAGE} on this host to push to the rack's registry: run make image"
        ) from None
    return image.push(client, reg)


def _stop_engines(state: RackState, quiet: bool) -> dict[str, int]:
    """Remove our containers from each engine, stop it, unmount what it left; then the registry and
    the management network. An engine that crashed is started again first, so that it removes its
    own containers (a crash leaves them running under its containerd)."""
    counts = {"containers": 0, "engines": 0}
    if not state.engines:
        return counts
    rack = _rack_of(state)
    plans = [engines.EnginePlan(**e) for e in state.engines]
    for plan in plans:
        try:
            crashed = engines.pid_of(plan) is None and engine_procs.containerd_pid(plan) is not None
            if rack is not None and crashed:  # its containers run on under its containerd
                engines.start(rack, plan)
                engines.wait_ready(rack, plan, timeout=30)
            if rack is not None and engines.pid_of(plan):
                counts["containers"] += engines.remove_our_containers(rack, plan, f"{CONTAINER_LABEL}={state.name}")
        except Exception as ex:  # noqa: BLE001 (keep taking the rest down)
            if not quiet:
                _log(f"  engine of {plan.server}: {ex.__class__.__name__}: {ex}")
    counts["engines"] = engines.stop_all(plans)
    if registry.stop() and not quiet:
        _log("  registry stopped")
    if state.registry:
        registry.untrust(state.registry)
    engines.remove_management([engines.EnginePlan(**e).leg for e in state.engines])
    return counts


def _rack_of(state: RackState):
    from controller.core.rack import RackError, load_rack

    try:
        return load_rack(state.rack_file)
    except RackError:
        return None


def _remove_containers(rack_name: str | None, quiet: bool) -> int:
    try:
        import docker

        client = docker.from_env(timeout=30)
        labels = f"{CONTAINER_LABEL}={rack_name}" if rack_name else CONTAINER_LABEL
        found = client.containers.list(all=True, ignore_removed=True, filters={"label": labels})
    except Exception as e:  # noqa: BLE001 (docker may be absent; the rest must still be cleaned)
        if not quiet:
            _log(f"  containers: not checked ({e.__class__.__name__}: {e})")
        return 0
    for c in found:
        c.remove(force=True)
    return len(found)


def down(quiet: bool = False, purge: bool = False) -> dict[str, int]:
    """Remove everything a rack made (the engines' image stores stay as a cache unless `purge`).
    Returns counts of what was removed."""
    state = RackState.load()
    removed = {"containers": 0, "engines": 0, "bridges": 0, "interfaces": 0, "namespaces": 0, "processes": 0}
    removed["slurm daemons"] = slurm.stop(quiet=quiet, log=_log)["daemons"]  # first: its slurmds run in the servers
    if state:
        removed["processes"] += aggregators.stop(state) + _stop_netconf(state)
        removed.update(_stop_engines(state, quiet))
    removed["containers"] += _remove_containers(state.name if state else None, quiet)
    labelled = ovs.rack_bridges()
    names = set(labelled) | set(state.bridges if state else [])
    for name in sorted(names):
        if name in labelled or name in ovs.bridges():
            ovs.vsctl("--if-exists", "del-br", name)
            removed["bridges"] += 1
    for pid in state.pids if state else []:
        try:
            os.kill(pid, 9)  # a Mininet shell this rack started and a crash left behind
            removed["processes"] += 1
        except ProcessLookupError:
            pass
    namespaces = set(state.namespaces.values()) if state else set()
    namespaces |= {n for n in ns.names() if n.startswith(NETNS_PREFIX)}
    for name in sorted(namespaces):
        if ns.exists(name):
            ns.delete(name)
            removed["namespaces"] += 1
    for intf in state.root_intfs if state else []:
        if ns.has_link(intf, None):
            ovs.run("ip", "link", "delete", "dev", intf, check=False)
            removed["interfaces"] += 1
    RackState.path().unlink(missing_ok=True)
    if purge:
        engines.purge_cache()
        removed["caches"] = 1
    if not quiet:
        what = ", ".join(f"{n} {k}" for k, n in removed.items() if n) or "nothing was left"
        _log(f"rack-down: removed {what}")
    return removed
