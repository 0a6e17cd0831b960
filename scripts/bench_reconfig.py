#!/usr/bin/env python3
"""Benchmark: control-plane overhead of a reconfiguration on the emulated rack.

Two figures per change, side by side:
- end to end: from the REST request (PUT /ocs/circuits, the client's clock just before it sends) until
  the switches confirmed the new forwarding (the event's flows_confirmed_at): the whole path through
  the controller, its REST handler, parsing, lock and plan included;
- the event's own: from the event's start (requested_at, taken after the lock, the plan and the
  parsing) until the switches confirmed, minus the modelled MEMS switching time (overhead_s).
Besides, how much controller work the dark window hid: the packet switches are re-programmed once the
changed circuits are dark, while the emulated OCS sleeps out its switching time, so that part costs
nothing until it outlasts the window (programming_in_dark_ms; what ran after it, programming_after_dark_ms).
Over NETCONF (the emulated NETCONF OCS, reached over SSH as a lab's is), where the time beyond switching goes, from
timestamps of the measured changes: the driver's whole time, each RPC's round trip (lock, edit-config, the confirmed
commit, get-config, the confirm, unlock: the controller's log; the get-config and the unlock are sent right behind
the commit and the confirm, so theirs count from the reply before them), the client's own time (the driver's less
its RPCs and its wait for the mirrors), the CPU time netconfd, our sshd with its sessions, and the emulation (its
front before netconfd, its agent and the agent's ovs-ofctl runs) spent per change (/proc), and the agent's own steps
(its log): the emulation's share apart from the driver's. Over NETCONF the next change goes only once the emulated
switch's agent has made the last one on its bridge, so that the emulation's flow work does not run into the next
change. Both clocks are the host's wall clock (the controller runs on this host). Measured for one circuit moved and
for every circuit moved at once, in one call (PUT /ocs/circuits), on the paper rack, on a generated 64-GPU rack, and
on a generated 512-GPU rack whose OCS has 1,024 ports (512 circuits changed at once). Racks of 256 GPUs or more are
brought up bare by default (emulation/bare.py: the same OVS bridges and controller path, no servers), since the full
rack takes minutes. Needs root (it brings racks up)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from controller.core.circuits import CircuitMap
from controller.core.rack import Rack, parse_rack
from controller.core.rackgen import rack_spec
from emulation.harness import ROOT, Testbed, free_port
from emulation.netconf_agent import TIMING as AGENT_TIMING  # the agent's log line for each change it makes

try:
    from scripts.stats import add_json_option, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, write_json


def _targets(rack: Rack) -> dict[str, CircuitMap]:
    """Circuit maps that move one GPU, and every GPU, to another downlink on its OCS (every GPU:
    the downlinks of each OCS rotated by half, so each GPU lands under another switch)."""
    start = CircuitMap.initial(rack)
    used = {p for c in start.circuits for p in c}
    free = [d.ocs_port for w in rack.spec.switches for d in w.downlinks if d.ocs_port not in used]
    port = rack.gpu_port(next(iter(rack.gpus)))
    spare = [f for f in free if f.device == port.device]
    other = next(d for w in rack.spec.switches for d in w.downlinks if d.ocs_port.device == port.device
                 and d.ocs_port != start.partner(port) and start.partner(d.ocs_port) is not None)
    one = [c for c in start.circuits if port not in c] + [(port, spare[0] if spare else other.ocs_port)]
    if not spare:  # every downlink is taken: swap with another GPU instead
        one = [c for c in one if other.ocs_port not in c or port in c]
        one.append((start.partner(other.ocs_port), start.partner(port)))
    moved = []
    for o in rack.ocs:
        gpus = sorted((g for g in rack.gpus if rack.gpu_port(g).device == o), key=lambda g: rack.gpu_port(g))
        downs = [d.ocs_port for w in rack.spec.switches for d in w.downlinks if d.ocs_port.device == o]
        half = len(downs) // 2
        moved += [(rack.gpu_port(g), downs[(i + half) % len(downs)]) for i, g in enumerate(gpus)]
    return {"one circuit": CircuitMap(one), "all circuits": CircuitMap(moved)}


def _programming(ev: dict) -> tuple[float, float, float]:
    """The switches' re-programming of one event (s): its whole span, the part inside the dark window, the part
    after it."""
    start, end = ev.get("fabric_started_at"), ev.get("fabric_confirmed_at")
    if start is None or end is None:
        return 0.0, 0.0, 0.0
    lo, hi = ev.get("dark_start") or start, ev.get("dark_end") or start
    inside = max(0.0, min(end, hi) - max(start, lo))
    return end - start, inside, max(0.0, end - max(start, hi))


RPCS = ("lock", "edit-config", "commit", "get-config", "confirm", "unlock")
DRIVER_LINE = "NETCONF change (ms) "  # controller.drivers.netconf logs one per change
AGENT_STEPS = ("get_config_ms", "dark_flows_ms", "switching_wait_ms", "new_flows_ms")


def _cpu_ms(pid: int, children: bool = False) -> float:
    """CPU time (user + system) process `pid` has used, in ms (0 if it is gone); with `children`, what its children
    that ended and were waited for used instead."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    at = 13 if children else 11
    return 1000.0 * (int(fields[at]) + int(fields[at + 1])) / os.sysconf("SC_CLK_TCK")


def _descendants(pid: int) -> list[int]:
    from emulation.netconf_ocs import _children

    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


class NetconfProbe:
    """What a NETCONF OCS's changes cost, between `start` and `stop`: the driver's log lines, the agent's, and the CPU
    of netconfd, of the front before it, of our sshd's sessions (their netconf-subsystem) and of the agent."""

    def __init__(self, controller, run_dir: Path):
        self.controller, self.run = controller, Path(run_dir)

    def _pids(self) -> dict[str, list[int]]:
        pid = lambda what: int((self.run / f"{what}.pid").read_text())  # noqa: E731
        return {"netconfd": [pid("netconfd")], "front": [pid("front")], "ssh": _descendants(pid("sshd")),
                "agent": [pid("agent")]}

    def _cpu(self) -> dict[str, float]:
        pids = self._pids()
        return {**{k: sum(_cpu_ms(p) for p in ps) for k, ps in pids.items()},
                "agent_ovs_ofctl": sum(_cpu_ms(p, children=True) for p in pids["agent"])}  # its ovs-ofctl runs

    def start(self) -> None:
        self.lines = len(self.controller.output().splitlines())
        self.agent_lines = len((self.run / "agent.log").read_text().splitlines())
        self.cpu0 = self._cpu()

    def stop(self, changes: int) -> dict:
        cpu = self._cpu()
        driver = [json.loads(x.split(DRIVER_LINE, 1)[1]) for x in self.controller.output().splitlines()[self.lines:]
                  if DRIVER_LINE in x]
        agent = [json.loads(x.split(f" {AGENT_TIMING} ", 1)[1]) for x in
                 (self.run / "agent.log").read_text().splitlines()[self.agent_lines:] if " timing " in x]
        med = lambda xs: round(statistics.median(xs), 2) if xs else None  # noqa: E731
        client = [d["total"] - sum(d.get(r, 0.0) for r in RPCS) - d.get("switching-wait", 0.0) for d in driver]
        return {
            "changes_logged": len(driver),
            "driver_ms_median": med([d["total"] for d in driver]),
            "rpc_ms_median": {r: med([d[r] for d in driver if r in d]) for r in RPCS},
            "rpcs_ms_median": med([sum(d.get(r, 0.0) for r in RPCS) for d in driver]),
            "client_ms_median": med(client),
            "switching_wait_ms_median": med([d.get("switching-wait", 0.0) for d in driver]),
            # CPU per change: the device's (netconfd), the SSH transport's (sshd's sessions), the emulation's (its
            # front, its agent and the agent's ovs-ofctl runs)
            "cpu_ms_per_change": {k: round((cpu[k] - self.cpu0[k]) / changes, 2) for k in cpu},
            "agent_ms_median": {k: med([a[k] for a in agent]) for k in AGENT_STEPS},
            "agent_after_commit_ms_median": med([1000 * (a["done"] - a["notified"]) for a in agent]),
            "next_change_after_agent": True,  # each change waited for the agent's last one (`_put`)
        }


def _agent_changes(run: Path) -> int:
    """How many changes the emulated NETCONF OCS's agent has made on its bridge (its timing lines)."""
    return (run / "agent.log").read_text(errors="replace").count(f" {AGENT_TIMING} {{")


def _put(tb, target: CircuitMap, probe: NetconfProbe | None) -> dict:
    """One change (PUT /ocs/circuits): its event, returned once the REST call returned; over NETCONF, only once the
    emulated switch's agent has made it on its bridge too (a few ms after the controller is done), so that the
    emulation's flow work for one change does not run into the next change's RPCs on the host's shared cores: a real
    switch's mirrors take none of the controller host's CPU."""
    made = _agent_changes(probe.run) if probe is not None else 0
    ev = tb.client.put("/ocs/circuits", {"circuits": target.to_json()})["event"]
    if probe is not None:
        deadline = time.monotonic() + 10
        while _agent_changes(probe.run) <= made:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the NETCONF OCS's agent did not make change {ev['id']} within 10 s "
                                   f"(see {probe.run}/agent.log)")
            time.sleep(0.005)
    return ev


def bench(rack: Rack, rack_file: Path, rounds: int, workdir: Path, bare: bool) -> list[dict]:
    rows = []
    t0 = time.monotonic()
    with Testbed(rack, rack_file, workdir, bare=bare) as tb:
        print(f"  {rack.name}: {len(rack.gpus)} GPUs{' (bare)' if bare else ''} up and synchronised in "
              f"{time.monotonic() - t0:.1f} s", flush=True)
        start = CircuitMap.initial(rack)
        for kind, target in _targets(rack).items():
            overheads, totals, rest, phases, e2e, before, programming = [], [], [], [], [], [], []
            probe = None
            if rack.spec.ocs[0].driver == "netconf":
                probe = NetconfProbe(tb.controller, tb.state.netconf[rack.spec.ocs[0].name])
            _put(tb, target, probe)  # warm-up, not counted
            _put(tb, start, probe)
            if probe is not None:
                probe.start()
            for _ in range(rounds):
                for t in (target, start):  # both ways change the same number of circuits
                    sent, c0 = time.time(), time.perf_counter()
                    ev = _put(tb, t, probe)
                    rest.append(time.perf_counter() - c0)
                    e2e.append(ev["flows_confirmed_at"] - sent)  # REST request -> confirmed forwarding
                    before.append(ev["requested_at"] - sent)  # REST, parsing, lock and plan: before the event
                    programming.append(_programming(ev))
                    totals.append(ev["total_s"])
                    overheads.append(ev["overhead_s"])
                    phases.append(
                        (
                            ev["dark_start"] - ev["requested_at"],
                            ev["dark_end"] - ev["dark_start"],
                            ev["ocs_confirmed_at"] - ev["dark_end"],
                            ev["flows_confirmed_at"] - ev["ocs_confirmed_at"],
                        )
                    )
            row = {
                "rack": rack.name,
                "driver": rack.spec.ocs[0].driver,
                "transport": rack.spec.ocs[0].address.split("://")[0] if rack.spec.ocs[0].address else None,
                "gpus": len(rack.gpus),
                "ports": rack.spec.ocs[0].ports,
                "change": kind,
                "circuits": len(start.diff(target).add),
                "switching_ms": 1000 * ev["switching_time_s"],
                "min_ms": 1000 * min(overheads),
                "median_ms": 1000 * statistics.median(overheads),
                "max_ms": 1000 * max(overheads),
                "total_ms_median": 1000 * statistics.median(totals),
                "rest_roundtrip_ms_median": 1000 * statistics.median(rest),
                # end to end: the REST request until the switches confirmed (the client's clock)
                "e2e_min_ms": 1000 * min(e2e),
                "e2e_median_ms": 1000 * statistics.median(e2e),
                "e2e_max_ms": 1000 * max(e2e),
                "e2e_overhead_median_ms": 1000 * (statistics.median(e2e) - ev["switching_time_s"]),
                "before_event_ms_median": 1000 * statistics.median(before),
                # the switches' re-programming: all of it, the part the dark window hid, the part after it
                "programming_ms_median": 1000 * statistics.median(p[0] for p in programming),
                "programming_in_dark_ms_median": 1000 * statistics.median(p[1] for p in programming),
                "programming_after_dark_ms_median": 1000 * statistics.median(p[2] for p in programming),
                "rounds": len(overheads),
                "bare": bare,
                # medians of: old circuits gone, dark window, until the OCS app confirmed, then the switches
                "phases_ms": {
                    k: round(1000 * statistics.median(p[i] for p in phases), 1)
                    for i, k in enumerate(("teardown", "dark", "ocs_confirmed", "flows_after_ocs"))
                },
            }
            if probe is not None:
                row["netconf"] = probe.stop(len(overheads))
                print(f"    {kind}: NETCONF split (ms): {json.dumps(row['netconf'])}", flush=True)
            rows.append(row)
            print(
                f"    {kind}: {row['circuits']} circuits, end to end median {row['e2e_median_ms']:.1f} ms, event "
                f"overhead median {row['median_ms']:.1f} ms (phases, ms: {row['phases_ms']}); switch programming "
                f"{row['programming_ms_median']:.1f} ms, {row['programming_in_dark_ms_median']:.1f} of it inside the "
                f"dark window",
                flush=True,
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="reconfigurations per case, each way (default %(default)s)")
    p.add_argument(
        "--gpus",
        default="6,64,512",
        help="racks: 6 is the paper rack, others are generated with 8 aggregator switches (from 256 GPUs "
        "one downlink per GPU: 512 GPUs make a 1,024-port OCS) (default %(default)s)",
    )
    p.add_argument(
        "--bare-from",
        type=int,
        default=256,
        metavar="GPUS",
        help="bring racks of this many GPUs or more up bare (default %(default)s)",
    )
    p.add_argument("--driver", default="openflow",
                   help="how the controller drives the OCS: openflow, or netconf to the emulated NETCONF OCS over "
                   "SSH (our sshd, netconfd and its agent, emulation/netconf_ocs.py); several, comma-separated, one "
                   "after the other into one record, e.g. openflow,netconf (default %(default)s)")
    add_json_option(p)
    args = p.parse_args(argv)
    try:
        sizes = [int(x) for x in args.gpus.split(",")]
    except ValueError:
        p.error("--gpus takes comma-separated integers, e.g. 6,64,512")
    drivers = args.driver.split(",")
    if not drivers or any(d not in ("openflow", "netconf") for d in drivers):
        p.error(f"--driver takes openflow and/or netconf, comma-separated (not {args.driver!r})")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        print("reconfiguration overhead (start -> flows confirmed, minus the MEMS switching time)", flush=True)
        for driver, n in ((d, n) for d in drivers for n in sizes):
            path = Path(tmp) / f"gen{n}.yaml"
            if n == 6:
                data = yaml.safe_load((ROOT / "topologies" / "paper-testbed.yaml").read_text())
            else:
                big = n >= 256  # 512 GPUs: 512 downlinks, a 1,024-port OCS
                data = rack_spec(n, gpus_per_server=8 if big else 4, switches=8, spare=1 if big else 2, name=f"gen{n}")
            if driver == "netconf":  # over SSH, as a lab's: rack-up makes the user, key and known_hosts named here
                for o in data["ocs"]:
                    run = f"/run/optirack/netconf-{o['name']}"
                    o.update(driver="netconf", address=f"ssh://optirack-nc@127.0.0.1:{free_port()}?known_hosts={run}/"
                             f"known_hosts&keyfile={run}/controller-key")
            path.write_text(yaml.safe_dump(data))
            rack = parse_rack(yaml.safe_load(path.read_text()), str(path))
            rows += bench(rack, path, args.rounds, Path(tmp) / f"{rack.name}-{driver}", bare=n >= args.bare_from)
    print("\nmedians in ms; end to end: REST request -> forwarding confirmed; event: requested_at -> confirmed; "
          "overhead: minus the switching time; programming: the switches' re-programming, and how much of it the "
          "dark window hid")
    print(
        f"{'rack':8s} {'driver':8s} {'GPUs':>5s} {'ports':>5s} {'change':13s} {'circuits':>8s} {'switching':>9s} "
        f"{'end to end':>10s} {'e2e ovh':>8s} {'event':>7s} {'ev ovh':>7s} {'(min-max)':>13s} "
        f"{'program':>8s} {'in dark':>8s}"
    )
    for r in rows:
        print(
            f"{r['rack']:8s} {r['driver']:8s} {r['gpus']:5d} {r['ports']:5d} {r['change']:13s} {r['circuits']:8d} "
            f"{r['switching_ms']:9.1f} {r['e2e_median_ms']:10.1f} {r['e2e_overhead_median_ms']:8.1f} "
            f"{r['total_ms_median']:7.1f} {r['median_ms']:7.1f} {r['min_ms']:6.1f}-{r['max_ms']:<6.1f} "
            f"{r['programming_ms_median']:8.1f} {r['programming_in_dark_ms_median']:8.1f}"
        )
    write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
