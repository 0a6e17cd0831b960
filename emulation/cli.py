"""`optirack-rack`: bring the emulated rack up or down, show it, or poke it with Mininet's CLI."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path

from controller.bundled import DEFAULT_RACK
from controller.core.rack import RackError, load_rack
from emulation import engines, ovs, servers
from emulation.netns import NetnsError, has_link
from emulation.rack import CONTAINER_LABEL, RackConflict, RackState, build, down, end_shells, up
from emulation.slurm import SlurmError


def _need_root() -> None:
    if os.geteuid() != 0:
        sys.exit("optirack-rack: the emulated rack needs root (bridges, namespaces): run it with sudo")


def _cmd_up(args) -> int:
    rack = load_rack(args.topo)
    print(
        f"bringing up {'a bare ' if args.bare else ''}rack {rack.name} from {args.topo} (controller {args.controller})",
        flush=True,
    )
    if args.bare:
        from emulation.bare import up_bare

        state = up_bare(rack, args.controller, wait_connected=args.wait)
    else:
        state = up(rack, args.controller, wait_connected=args.wait, with_slurm=args.slurm,
                   slurm_hook=_hook(args) if args.slurm else None)
    connected = [b for b in state.bridges if ovs.controller_connected(b)]
    print(
        f"rack {state.name} is up in {state.up_seconds:.1f} s: {len(state.bridges)} bridges, "
        f"{len(state.nics)} GPU NICs, {len(state.namespaces)} servers"
    )
    for b in state.bridges:
        print(f"  {b:10s} controller {'connected' if b in connected else 'NOT connected'} ({args.controller})")
    if len(connected) < len(state.bridges):
        print("  (bridges connect once a controller listens there: make controller)")
    return 0


def _default_hook() -> str | None:
    """The PrologSlurmctld/EpilogSlurmctld program installed beside this one."""
    path = Path(sys.argv[0]).resolve().parent / "optirack-slurm-hook"
    return str(path) if path.exists() else shutil.which("optirack-slurm-hook")


def _hook(args):
    from emulation.slurm import Hook

    if not args.slurm_hook or args.slurm_hook == "none":
        return None
    return Hook(args.slurm_hook, args.controller_url, args.token_file)


def _slurm_options(sp) -> None:
    sp.add_argument("--slurm-hook", default=_default_hook(), help="the PrologSlurmctld/EpilogSlurmctld program "
                    "(default: optirack-slurm-hook beside this command; 'none' for no hooks)")
    sp.add_argument("--controller-url", help="the controller's REST URL the hooks call (default http://127.0.0.1:8080)")
    sp.add_argument("--token-file", help="its token (default /var/lib/optirack/token)")


def _cmd_slurm(args) -> int:
    """Start Slurm on the rack that is up (stopping one of ours first), stop it, or show it."""
    from emulation import slurm

    if args.action == "stop":
        slurm.stop(log=print)
        return 0
    if args.action == "status":
        if not slurm.daemon_pids():
            print("Slurm is not running on the emulated rack")
            return 1
        for name, pid in slurm.daemon_pids().items():
            print(f"  {name:16s} PID {pid}")
        print(slurm.run("sinfo", "--Node", "--format=%N %T %G").stdout.rstrip())
        print(f"SLURM_CONF={slurm.LAYOUT.conf}")
        return 0
    state = RackState.load()
    if state is None or state.status != "up":
        print("error: no rack is up (make rack-up)", file=sys.stderr)
        return 1
    slurm.start(load_rack(state.rack_file), _hook(args), log=print)
    return 0


def _cmd_down(args) -> int:
    down(purge=args.purge)
    return 0


def _cmd_engine(args) -> int:
    """Start, stop or crash one emulated server's engine (to try failures; rack-up starts them all)."""
    state = RackState.load()
    plans = {e["server"]: engines.EnginePlan(**e) for e in (state.engines if state else [])}
    if args.server not in plans:
        sys.exit(
            f"optirack-rack: no emulated engine for server {args.server!r} "
            f"(this rack's: {', '.join(plans) or 'none; is a rack up?'})"
        )
    plan, rack = plans[args.server], load_rack(state.rack_file)
    if args.action == "start":
        engines.start(rack, plan)
        print(f"engine of {plan.server} answers at {plan.url} after {engines.wait_ready(rack, plan):.1f} s")
    else:
        ran = engines.stop(plan, signal.SIGKILL if args.action == "kill" else signal.SIGTERM)
        print(
            f"engine of {plan.server} {'killed' if args.action == 'kill' else 'stopped'}"
            if ran
            else f"engine of {plan.server} was not running"
        )
    return 0


def _cmd_server(args) -> int:
    """A whole server dies (engine, containerd, shims, workers; NIC ports down), or comes back empty."""
    state = RackState.load()
    plans = {e["server"]: engines.EnginePlan(**e) for e in (state.engines if state else [])}
    if args.server not in plans:
        print(
            f"error: server: no emulated server {args.server!r} "
            f"(this rack's: {', '.join(plans) or 'none; is a rack up?'})",
            file=sys.stderr,
        )
        return 2
    plan, rack = plans[args.server], load_rack(state.rack_file)
    if args.action == "hang":
        r = servers.hang(plan)
        print(f"server {plan.server} hung: {r['stopped']} process(es) stopped (engine, containerd, shims, workers), "
              "links up; `optirack-rack server wake` continues them")
    elif args.action == "wake":
        r = servers.wake(plan)
        print(f"server {plan.server} woke: {r['continued']} process(es) continued")
    elif args.action == "kill":
        r = servers.kill(rack, plan)
        engine = "killed" if r["engine"] else "was not running"
        print(
            f"server {plan.server} killed in {r['seconds']:.2f} s: engine {engine}, {r['shims']} container shim(s) "
            f"and their containers killed, NIC ports down: {', '.join(r['ports_down'])}"
            + (f"; NICs gone with their containers: {', '.join(r['nics_dropped'])}" if r["nics_dropped"] else "")
        )
    else:
        r = servers.start(rack, plan, f"{CONTAINER_LABEL}={rack.name}")
        print(
            f"server {plan.server} back in {r['seconds']:.1f} s: engine answers at {plan.url}, "
            f"{r['containers_removed']} container(s) and {r['volumes_removed']} volume(s) of ours removed, NICs at home"
        )
    return 0


def status_dict() -> dict:
    state = RackState.load()
    if state is None:
        return {"up": False, "leftover_bridges": sorted(ovs.rack_bridges())}
    result = {"up": state.status == "up", "name": state.name, "rack_file": state.rack_file, "bridges": {}, "nics": {}}
    existing = ovs.bridges()
    for b in state.bridges:
        if b not in existing:
            result["bridges"][b] = {"missing": True}
            continue
        ports = ovs.bridge_ports(b)
        result["bridges"][b] = {
            "connected": ovs.controller_connected(b),
            "controller": state.controller,
            "ports": {
                str(no): {"interface": name, "mbps": ovs.shaped_mbps(name)}
                for name, no in sorted(ports.items(), key=lambda x: x[1])
            },
        }
    for gpu, nic in state.nics.items():
        where = state.namespaces[nic["server"]]
        result["nics"][gpu] = {
            "server": nic["server"],
            "ip": nic["ip"],
            "ocs_port": f"{nic['ocs']}:{nic['ocs_port']}",
            "mbps": nic["mbps"],
            "present": has_link(nic["ifname"], where),
        }
    result["engines"] = {
        e["server"]: {"url": engines.EnginePlan(**e).url, "pid": engines.pid_of(engines.EnginePlan(**e))}
        for e in state.engines
    }
    result["registry"] = state.registry
    ocs = {n["ocs"] for n in state.nics.values()}
    result["circuits"] = {o: sorted(ovs.circuits_of(ovs.circuit_flows(o))) for o in ocs if o in existing}
    return result


def _cmd_status(args) -> int:
    s = status_dict()
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    if not s["up"]:
        extra = (
            f" (leftover bridges: {', '.join(s['leftover_bridges'])}; make rack-down)"
            if s.get("leftover_bridges")
            else ""
        )
        print(f"no rack is up{extra}")
        return 1
    print(f"rack {s['name']} ({s['rack_file']})")
    for name, b in s["bridges"].items():
        if b.get("missing"):
            print(f"  bridge {name}: MISSING")
            continue
        print(f"  bridge {name}: controller {b['controller']} {'connected' if b['connected'] else 'not connected'}")
        for no, p in b["ports"].items():
            rate = f"{p['mbps']:g} Mbit/s" if p["mbps"] else "unshaped"
            print(f"    port {no:>4}  {p['interface']:12s} {rate}")
    print("  GPU NICs:")
    for gpu, n in s["nics"].items():
        where = f"in {n['server']}" if n["present"] else f"not in {n['server']} (in a container?)"
        print(f"    {gpu:6s} {n['ip']:15s} {n['ocs_port']:9s} {n['mbps']:g} Mbit/s  {where}")
    for server, e in s["engines"].items():
        print(f"  engine of {server}: {e['url']} " + (f"running (PID {e['pid']})" if e["pid"] else "NOT running"))
    if s["registry"]:
        print(f"  registry: {s['registry']}")
    for o, circuits in s["circuits"].items():
        print(f"  circuits on {o}: " + (", ".join(f"{a}<->{b}" for a, b in circuits) or "none"))
    return 0


def _cmd_cli(args) -> int:
    from mininet.cli import CLI

    if RackState.load():
        sys.exit("a rack is up; take it down first (make rack-down): the CLI runs its own rack in the foreground")
    rack = load_rack(args.topo)
    net, state = build(rack, args.controller, log_level="output")  # the CLI prints at this level
    try:
        print(
            "Mininet CLI on rack",
            rack.name,
            "- servers:",
            " ".join(h.name for h in net.hosts),
            "- 'exit' tears it down",
        )
        CLI(net)
    finally:
        end_shells(net)
        down(quiet=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="optirack-rack", description="The emulated optirack rack (Mininet on Open vSwitch)."
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def with_topo(sp):
        sp.add_argument("--topo", default=str(DEFAULT_RACK), help="rack file (default: the paper testbed)")
        sp.add_argument(
            "--controller", default="127.0.0.1:6653", help="OpenFlow controller HOST:PORT (default %(default)s)"
        )

    sp = sub.add_parser("up", help="build the rack; it stays up until 'down'")
    with_topo(sp)
    sp.add_argument("--wait", type=float, default=5.0, help="seconds to wait for controller connections (default 5)")
    sp.add_argument(
        "--bare",
        action="store_true",
        help="bridges only, no servers: GPU NICs are patch ports to a stub bridge (for control-plane "
        "benchmarks at hundreds of GPUs, where the full rack takes minutes; carries no traffic)",
    )
    sp.add_argument("--slurm", action="store_true",
                    help="also start Slurm on it: munged and slurmctld here, one slurmd in each server (docs/slurm.md)")
    _slurm_options(sp)
    sp.set_defaults(func=_cmd_up)
    sp = sub.add_parser("slurm", help="start Slurm on the rack that is up, stop it, or show it (docs/slurm.md)")
    sp.add_argument("action", choices=["start", "stop", "status"])
    _slurm_options(sp)
    sp.set_defaults(func=_cmd_slurm)
    sp = sub.add_parser("down", help="remove everything the rack made (safe to repeat)")
    sp.add_argument(
        "--purge",
        action="store_true",
        help="also remove the caches rack-down keeps: each engine's image store and the registry's storage",
    )
    sp.set_defaults(func=_cmd_down)
    sp = sub.add_parser("engine", help="start, stop (SIGTERM) or kill (SIGKILL, a crash) one server's engine")
    sp.add_argument("action", choices=["start", "stop", "kill"])
    sp.add_argument("server", help="server name, e.g. srv2")
    sp.set_defaults(func=_cmd_engine)
    sp = sub.add_parser(
        "server", help="kill a whole server (engine, containerd, shims, workers; NIC ports down) or start it empty; "
        "hang it (every process stopped, links up) or wake it"
    )
    sp.add_argument("action", choices=["kill", "start", "hang", "wake"])
    sp.add_argument("server", help="server name, e.g. srv2")
    sp.set_defaults(func=_cmd_server)
    sp = sub.add_parser("status", help="bridges, ports, line rates, circuits, controller connections")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=_cmd_status)
    sp = sub.add_parser("cli", help="build the rack in the foreground with Mininet's CLI; exiting tears it down")
    with_topo(sp)
    sp.set_defaults(func=_cmd_cli)
    return p


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `optirack-rack status | head` ends quietly
    args = build_parser().parse_args(argv)
    _need_root()
    try:
        return args.func(args)
    except RackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (RackConflict, NetnsError, engines.EngineError, SlurmError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
