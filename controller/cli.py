"""`optirack`: the command-line client (rack file checks, and the controller's REST API)."""
from __future__ import annotations

import argparse
import sys
import time
from importlib.metadata import entry_points

from controller.bundled import DEFAULT_RACK
from controller.cli_common import _client, _print
from controller.cli_jobs import add_job_commands
from controller.client import ApiError
from controller.core.emulated import emulated_rack_name
from controller.core.rack import RackError, load_rack


def _check_topology(args) -> int:
    from controller.core import aggregators

    try:
        rack = load_rack(args.file)
        aggregators.check(rack)
    except RackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(rack.summary())
    print(f"{args.file}: OK")
    return 0


def _rack_check(args) -> int:
    from controller.drivers.containers import ContainerDriver
    from controller.drivers.rackcheck import check_rack

    try:
        rack = load_rack(args.rack)
    except RackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    emulated = args.gpus == "emulated" or (args.gpus == "auto" and _emulated_here(rack.name))
    driver = ContainerDriver(rack, "", nic_home="host")  # no worker is started: only the NIC helper
    print(
        f"rack {rack.name}: asking {len(rack.servers)} engines (GPUs {'emulated' if emulated else 'required'})",
        flush=True,
    )
    results = check_rack(driver, emulated)
    for r in results:
        print(r.line())
    failed = [r for r in results if not r.ok]
    if failed:
        print(
            "rack-check failed: " + "; ".join(f"{r.server}: {r.text.split('; ')[-1]}" for r in failed), file=sys.stderr
        )
        return 1
    return 0


def _emulated_here(name: str) -> bool:
    """Whether this host's emulated rack of that name is up (its GPUs are emulated)."""
    return emulated_rack_name() == name


def _mbps(bps) -> str:
    return "-" if bps is None else f"{bps / 1e6:7.2f}"


def _topology(args) -> int:
    t = _client(args).get("/topology")
    lines = [f"rack {t['rack']}: {t['description']}"]
    for name, o in t["ocs"].items():
        lines.append(
            f"  OCS {name}: {o['ports']} ports, {o['switching_time_ms']:g} ms, {o['driver']}, "
            f"{'connected' if o['connected'] else 'NOT connected'}"
        )
    for name, w in t["switches"].items():
        lines.append(f"  switch {name} ({w['role']}): {'connected' if w['connected'] else 'NOT connected'}")
    frag = t.get("fragmentation")
    if frag:
        by_model = ", ".join(f"{m} {n}" for m, n in frag["largest_by_model"].items())
        lines.append(
            f"  free GPUs: {frag['free_gpus']}; the largest job one switch can take now: "
            f"{frag['largest_job_one_switch']} ({by_model})"
        )
    lines.append(f"  {'GPU':6s} {'model':7s} {'server':6s} {'address':14s} {'OCS port':9s} {'switch':9s} job")
    for name, g in t["gpus"].items():
        sw = f"{g['switch']['name']}:{g['switch']['port']}" if g["switch"] else "-"
        lines.append(
            f"  {name:6s} {g['model']:7s} {g['server']:6s} {g['ip']:14s} {g['ocs_port']:9s} {sw:9s} {g['job'] or '-'}"
        )
    _print(args, t, "\n".join(lines))
    return 0


def _parse_pair(text: str) -> list[str]:
    a, sep, b = text.partition("=")
    if not sep:
        raise SystemExit(f"optirack: expected PORT=PORT, e.g. ocs1:1=ocs1:11, not {text!r}")
    return [a, b]


def _circuits(args) -> int:
    client = _client(args)
    if args.set is not None:
        headers = {"If-Match": f'"{args.if_match}"'} if args.if_match is not None else None
        data = client.put("/ocs/circuits", {"circuits": [_parse_pair(p) for p in args.set]}, headers)
        ev = data["event"]
        text = (
            f"applied: -{len(ev['removed'])} +{len(ev['added'])} circuits; "
            f"dark {1000 * (ev['dark_window_s'] or 0):.1f} ms, "
            f"flows confirmed after {1000 * ev['total_s']:.1f} ms; now version {data['version']}"
            if ev
            else f"nothing to change (version {data['version']})"
        )
        _print(args, data, text)
        return 0
    data = client.get("/ocs/circuits", **({"device": "1"} if args.device else {}))
    text = f"version {data['version']}\n" + ("\n".join(f"{a} = {b}" for a, b in data["circuits"]) or "no circuits")
    if args.device:
        for ocs, have in data.get("device", {}).items():
            text += f"\n{ocs} reports: " + ("unreachable" if have is None else f"{len(have)} circuits")
    _print(args, data, text)
    return 0


def _stats(args) -> int:
    data = _client(args).get("/stats/ports", history=args.history)
    lines = [f"  {'GPU':6s} {'OCS port':9s} {'tx Mbit/s':>9s} {'rx Mbit/s':>9s}"]
    for gpu, s in data["gpus"].items():
        lines.append(f"  {gpu:6s} {s['ocs_port']:9s} {_mbps(s['tx_bps']):>9s} {_mbps(s['rx_bps']):>9s}")
    _print(args, data, "\n".join(lines))
    return 0


def _events(args) -> int:
    data = _client(args).get("/events", limit=args.limit, **({"before": args.before} if args.before else {}))
    lines = []
    for e in data["events"]:
        when = time.strftime("%H:%M:%S", time.localtime(e["requested_at"]))
        dark = "-" if e["dark_window_s"] is None else f"{1000 * e['dark_window_s']:.1f} ms"
        total = "-" if e["total_s"] is None else f"{1000 * e['total_s']:.1f} ms"
        lines.append(
            f"#{e['id']:<4} {when} {e['kind']:8s} {e['status']:7s} -{len(e['removed'])} +{len(e['added'])} "
            f"dark {dark}, done after {total}  {e['reason']}" + (f"  ERROR: {e['error']}" if e["error"] else "")
        )
    if data.get("older"):
        lines.append(f"(older events: optirack events --before {data['older']})")
    _print(args, data, "\n".join(lines) or "no reconfigurations yet")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="optirack",
        description="Client for optirack, the SDN control plane of optically reconfigurable GPU racks.",
        epilog="The controller's URL comes from --url or $OPTIRACK_URL (default http://127.0.0.1:8080); the token for "
        "changes from --token, $OPTIRACK_TOKEN or the token file (default /var/lib/optirack/token).",
    )
    parser.add_argument("--url", help="controller REST URL")
    parser.add_argument("--token", help="bearer token for changes")
    parser.add_argument("--token-file", help="file holding the token")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "check-topology",
        help="validate a rack file and print its summary",
        description="Validate a rack file. Exit 0 if it is good, 2 with the field at fault if not.",
    )
    p.add_argument("file", help="rack file (YAML), e.g. topologies/paper-testbed.yaml")
    p.set_defaults(func=_check_topology)

    p = sub.add_parser(
        "rack-check",
        help="ask every server's Docker Engine whether it can run jobs",
        description="Ask every server's engine: reachable, GPUs and the NVIDIA runtime, the NIC helper "
        "with the CNI plugins, each NIC the rack file names. One line per server; exit 1 "
        "naming the server and the cause when something is missing, 2 for a bad rack file.",
    )
    p.add_argument("--rack", default=str(DEFAULT_RACK), help="rack file (default: the paper testbed)")
    p.add_argument(
        "--gpus",
        choices=["auto", "required", "emulated"],
        default="auto",
        help="auto: emulated if this host's emulated rack of that name is up, else required",
    )
    p.set_defaults(func=_rack_check)

    p = sub.add_parser("topology", help="the rack as the controller sees it")
    p.set_defaults(func=_topology)

    p = sub.add_parser("circuits", help="show the circuits, or replace them with --set")
    p.add_argument(
        "--set", nargs="*", metavar="PORT=PORT", help="the new circuit set, e.g. ocs1:1=ocs1:11 ocs1:2=ocs1:12"
    )
    p.add_argument("--device", action="store_true", help="also ask each OCS what it holds")
    p.add_argument(
        "--if-match",
        type=int,
        metavar="VERSION",
        help="with --set: apply only if the circuits are still at this version (shown by `optirack circuits`); "
        "otherwise the controller refuses with 409 and changes nothing",
    )
    p.set_defaults(func=_circuits)

    p = sub.add_parser("stats", help="throughput of each GPU NIC")
    p.add_argument("--history", type=int, default=0, help="also fetch this many samples per GPU")
    p.set_defaults(func=_stats)

    p = sub.add_parser("events", help="reconfigurations with their timestamps")
    p.add_argument("--limit", type=int, default=20, help="how many, the newest first (default %(default)s)")
    p.add_argument("--before", type=int, metavar="ID", help="the page of events older than event ID")
    p.set_defaults(func=_events)

    add_job_commands(sub)

    # Commands of other packages (`optirack simulate`: the simulator, offline) register themselves under the entry
    # point group optirack.commands, so the controller imports none of them.
    for ep in sorted(entry_points(group="optirack.commands"), key=lambda e: e.name):
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ApiError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
