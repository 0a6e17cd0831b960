#!/usr/bin/env python3
"""Benchmark: a server killed, or one worker killed with SIGKILL, under a running job, from the kill to every rank
iterating again.

On the paper rack with spares (topologies/paper-spares.yaml: a fifth server with two M40 under the other switch), each
round runs a 4-GPU job on the four M40 of srv1-srv4 (gpu_model M40, so the spare must be one of srv5's), kills one of
its servers with `optirack-rack server kill` (engine, containerd, shims, workers; NIC ports down), waits until every
rank iterates again, lets the job run to its end (`done`, the swap in its record; the round counts only then) and
starts the server again (empty). Each round's time from the kill to all
ranks iterating again is split into: detection (kill -> the job `recovering`), planning (waiting for a sure sign,
stopping the lost workers and choosing the spares), the OCS change (circuits and flows confirmed), hand-over (the
survivors and the job's warm spare told their ranks; a spare with no warm worker gets its sandbox, NIC and worker
started), state fetch (until the last rank has its checkpoint: survivors from their own memory, the spare from a
peer's memory) and rendezvous (until every rank has begun its first iteration); plus the iterations redone
(checkpoints every iteration by default). Each phase and the total are given as p50 and max over the rounds; where
phases overlap (after a restart kept workers restore while cold ones start) a phase counts from the end of the one
before, so phases are never negative and sum to the total.
The faults (`--fault`), each on a live host: `server` kills the server's daemons and workers (`optirack-rack server
kill`: engine, containerd, shims, containers, SIGKILL; NIC ports down), so every connection to it is refused at once;
`worker` kills one worker (`kill -9` of the process its container runs, its host PID found from the container on that
server's engine): its server lives on, and its GPU is swapped as well; `cascade` kills the server's workers first and
its daemons 50-200 ms later (the order a host on its way down often shows); `hang` stops every process of the server
(SIGSTOP, links up: nothing is refused, no link goes down), then wakes it once the job iterates again and checks that
its stale workers were removed and recorded nothing; `restart` runs the controller with the fault hook holding
recoveries at one persisted step (each step in turn, round by round), kills a server, kills the controller (`kill -9`)
once the recovery is held there, starts it again, and measures from the controller back to every rank iterating.

`--checkpoint-cost` measures what saving checkpoints costs instead: the same job (or `--gpus`) run to its end with
checkpoints every K iterations (`--checkpoint-every`, here 20 by default, the controller's default) and with none
(K beyond its last iteration), alternately, `--pairs` times: the mean iteration time of each (the first iteration,
the processes' warm-up, left out), their difference as a share of the one without, and each save's own times from the
workers' `checkpoint` lines (`local_s`: the training loop held while writing its copy; `save_s`: until the peer on
another server holds one).
Needs root (it brings the rack up). `--json PATH` writes the rounds and the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from controller.core.circuits import CircuitMap
from controller.core.jobs import DEFAULT_CHECKPOINT_EVERY
from controller.core.rack import load_rack
from controller.drivers.containers import container_name
from controller.drivers.engines import engine_client
from emulation import engines, servers
from emulation.harness import ROOT, Testbed, wait_for
from emulation.rack import CONTAINER_LABEL

try:
    from scripts.stats import add_json_option, percentile, write_json
except ModuleNotFoundError:  # run as a file (python scripts/bench_….py): scripts/ itself is on sys.path
    from stats import add_json_option, percentile, write_json

RACK_FILE = ROOT / "topologies" / "paper-spares.yaml"
JOB_GPUS = ["gpu1", "gpu2", "gpu3", "gpu4"]
FAULTS = ("server", "worker", "cascade", "hang", "restart")
STEPS = ("detected", "assessed", "swapped", "told", "restarting")  # controller/jobs/recovery.py's persisted steps
VICTIMS = ["srv2", "srv4"]  # servers holding one GPU of the job each (srv1 and srv3 also hold a Titan V)
WORKER_VICTIMS = ["gpu2", "gpu4", "gpu1", "gpu3"]  # --fault worker: the rank killed, in turn
PHASES = ("detection_s", "planning_s", "ocs_s", "containers_s", "restore_s", "rendezvous_s")
LABELS = {"detection_s": "detection", "planning_s": "planning", "ocs_s": "OCS change", "containers_s": "hand-over",
          "restore_s": "state fetch", "rendezvous_s": "rendezvous", "total_s": "total"}



def kill_worker(tb: Testbed, job: str, gpu: str) -> int:
    """`kill -9` of the worker of `gpu`: the process its container runs (its host PID, from the server's engine)."""
    c = engine_client(tb.rack, tb.rack.server_of[gpu], 30).containers.get(container_name(job, gpu))
    pid = c.attrs["State"]["Pid"]
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    if "containers.worker" not in cmdline:  # the container's own process, checked, never looked up by name
        raise RuntimeError(f"the container of {gpu} runs {cmdline!r}, not the worker")
    os.kill(pid, signal.SIGKILL)
    return pid


def victims_of(rack, gpus: list[str], fault: str) -> list[str]:
    """What each round strikes, in turn: a rank's worker (`worker`), else a server holding a rank but the first."""
    if gpus == JOB_GPUS and rack.name == load_rack(RACK_FILE).name:
        return WORKER_VICTIMS if fault == "worker" else VICTIMS
    if fault == "worker":
        return gpus[1:] + gpus[:1]
    first = rack.server_of[gpus[0]]
    return list(dict.fromkeys(rack.server_of[g] for g in gpus if rack.server_of[g] != first))


CURRENT: dict = {}  # the job of the round under way (what a failed round's diagnostics keep)


def inject(tb: Testbed, plans: dict, fault: str, victim: str, jid: str, number: int) -> dict:
    """The fault, as its name says (see above); what it did, with the time it struck."""
    at: dict = {"at": time.time()}
    if fault == "worker":
        kill_worker(tb, jid, victim)
    elif fault == "cascade":
        gap = random.Random(number).uniform(0.05, 0.2)
        at["workers_killed"] = servers.kill_containers(tb.rack, plans[victim])
        time.sleep(gap)
        servers.kill(tb.rack, plans[victim])
        at["gap_s"] = gap
    elif fault == "hang":
        at["stopped"] = servers.hang(plans[victim])["stopped"]
    else:  # server, restart
        servers.kill(tb.rack, plans[victim])
    return at


def restart_at(tb: Testbed, jid: str, step: str) -> float:
    """The controller, held at `step` of the job's recovery by the fault hook, killed (`kill -9`) there and started
    again without the hook; when its REST API answered again."""
    held = f"{jid}: recovery held at step {step}"
    wait_for(lambda: held in tb.controller.output(), 60, f"the recovery held at {step}", interval=0.05)
    tb.controller.kill()
    tb.controller.extra = []
    tb.controller.start()
    tb.client = tb.controller.client()
    return time.time()


def one_round(tb: Testbed, plans: dict, victim: str, every: int, before_kill: int, iterations: int,
              fault: str = "server", number: int = 0, gpus: list[str] = JOB_GPUS) -> dict:
    step = STEPS[number % len(STEPS)] if fault == "restart" else None
    if step is not None:  # the controller with the hook holding this round's recoveries at `step`
        tb.controller.stop()
        tb.controller.extra = ["--optirack-fault-hold-recovering", step]
        tb.controller.start()
        tb.client = tb.controller.client()
        wait_for(tb._ready, 30, "the rack to be in step with the controller")
    client = tb.client
    # the rack file's cabling again (circuits outlive jobs): the spares under as2, the job to be placed under as1,
    # so that every round moves a spare's circuit
    client.put("/ocs/circuits", {"circuits": CircuitMap.initial(tb.rack).to_json()})
    models = {tb.rack.gpus[g].model for g in gpus}
    job = client.post("/jobs", {"gpus": gpus, "checkpoint_every": every, "workload": {"iterations": iterations},
                                **({"gpu_model": models.pop()} if len(models) == 1 else {})})["job"]
    jid = CURRENT["job"] = job["id"]
    wait_for(lambda: client.get(f"/jobs/{jid}")["job"]["iterations_done"] >= before_kill, 300, "iterations")
    fault_at = inject(tb, plans, fault, victim, jid, number)
    killed_at = fault_at["at"]
    back_at = None
    if step is not None:
        back_at = restart_at(tb, jid, step)
        client = tb.client
    wait_for(lambda: client.get(f"/jobs/{jid}")["job"]["recoveries"], 120, "the recovery", interval=0.05)
    rec = client.get(f"/jobs/{jid}")["job"]["recoveries"][0]

    def again():
        j = client.get(f"/jobs/{jid}")["job"]
        ranks = j["ranks"]
        starts = [
            min((r["t_start"] for r in ranks[g] if r.get("attempt") == rec["attempt"]), default=None) for g in j["gpus"]
        ]
        return None if None in starts else (j, max(starts))

    j, iterating_at = wait_for(again, 120, "every rank to iterate again", interval=0.05)
    restored = [r["t"] for g in j["gpus"] for r in j["checkpoints"][g] if r["event"] == "restored"
                and r.get("attempt") == rec["attempt"]]
    restored_at = max(restored) if len(restored) == len(j["gpus"]) else rec["running_at"]
    ended = ("done", "failed", "stopped")
    woke: dict = {}
    if fault == "hang":  # it wakes: swept by the controller before its GPUs are free, its stale workers fenced out
        woke_at = time.time()
        servers.wake(plans[victim])
        wait_for(lambda: client.get("/topology")["servers"][victim]["engine"]["up"], 60, f"{victim} swept and up")
        woke = {"swept_s": time.time() - woke_at, "left": stale_containers(tb, victim, jid)}
    final = wait_for(lambda: (j := client.get(f"/jobs/{jid}")["job"])["state"] in ended and j, 600, "the job to end")
    if fault == "hang":
        detail = client.get(f"/jobs/{jid}")["job"]
        woke["recorded_after_wake"] = sum(1 for g in rec["lost"] for r in detail["ranks"].get(g, [])
                                          if r.get("t_start", 0) > woke_at)
    elif victim in plans:
        servers.start(tb.rack, plans[victim], f"{CONTAINER_LABEL}={tb.rack.name}")
        wait_for(lambda: client.get("/topology")["servers"][victim]["engine"]["up"], 30, f"{victim} up")
    # The phases' boundaries in order; after a restart they may overlap (kept workers restore while cold ones start;
    # ranks told before the controller died iterate before the new one records the job running), so each is taken no
    # earlier than the one before it and no later than every rank iterating: phases never negative, summing to the total
    bounds = [killed_at, rec["detected_at"], rec["planned_at"] - rec.get("ocs_s", 0.0), rec["planned_at"],
              rec["running_at"], restored_at, iterating_at]
    for i in range(1, len(bounds)):
        bounds[i] = min(max(bounds[i], bounds[i - 1]), iterating_at)
    detection, planning, ocs, containers, restore, rendezvous = (bounds[i + 1] - bounds[i] for i in range(6))
    return {
        "job": jid,
        "state": final["state"],
        "reason": final["reason"],
        "iterations_done": final["iterations_done"],
        "recoveries": len(final["recoveries"]),
        "killed": victim,
        "lost": sorted(rec["lost"]),
        "why": rec["lost"],
        "spares": rec["spares"],
        "warm": rec.get("warm", {}),
        "kept": rec.get("kept", []),
        "checkpoint_every": every,
        "resumed_from": rec["resumed_from"],
        "iterations_redone": rec["iterations_redone"],
        "total_s": iterating_at - killed_at,
        "detection_s": detection,
        "planning_s": planning,
        "ocs_s": ocs,
        "containers_s": containers,
        "restore_s": restore,
        "rendezvous_s": rendezvous,
        "switches_after": j["switches"],
        "circuit_event": rec["event"],
        "mean_iteration_s": final["mean_iteration_s"],
        "fault": fault,
        "replans": rec.get("replans", 0),
        **({"gap_s": fault_at["gap_s"]} if "gap_s" in fault_at else {}),
        **({"held_at": step, "back_s": iterating_at - back_at} if step is not None else {}),
        **({"woke": woke} if woke else {}),
    }


def stale_containers(tb: Testbed, server: str, jid: str) -> int:
    """Our containers of job `jid` left on `server` (a woken server's stale workers: the controller removes them)."""
    client = engine_client(tb.rack, server, 30)
    return len(client.containers.list(all=True, filters={"label": [f"{CONTAINER_LABEL}={tb.rack.name}",
                                                                   f"org.optirack.job={jid}"]}))


def failed_round(tb: Testbed, plans: dict, victim: str, number: int, error: Exception) -> dict:
    """A round that did not end in one recovery: its job's record, every rank's log and the controller's log kept
    in a directory (named in the row), the job stopped and the killed server started again, so the next round
    starts clean."""
    client = tb.client
    where = Path(tempfile.mkdtemp(prefix=f"optirack-failover-round{number}-"))
    jid = CURRENT.pop("job", None)
    if jid:
        (where / "job.json").write_text(json.dumps(client.get(f"/jobs/{jid}")["job"], indent=1))
        try:
            (where / "ranks.json").write_text(json.dumps(client.get(f"/jobs/{jid}/logs"), indent=1))
        except Exception as e:  # noqa: BLE001 (the diagnostics keep what they can get)
            (where / "ranks.json").write_text(json.dumps({"error": str(e)}))
    (where / "controller.log").write_text(tb.controller.output() if hasattr(tb, "controller") else "")
    if jid and client.get(f"/jobs/{jid}")["job"]["state"] not in ("done", "failed", "stopped"):
        client.post(f"/jobs/{jid}/stop")
        wait_for(lambda: client.get(f"/jobs/{jid}")["job"]["state"] in ("done", "failed", "stopped"), 60, "the stop")
    if victim in plans and not client.get("/topology")["servers"][victim]["engine"]["up"]:
        servers.start(tb.rack, plans[victim], f"{CONTAINER_LABEL}={tb.rack.name}")
        wait_for(lambda: client.get("/topology")["servers"][victim]["engine"]["up"], 30, f"{victim} up")
    return {"job": jid, "killed": victim, "state": "failed", "failed": str(error), "recoveries": 0,
            "diagnostics": str(where)}


def run_to_end(tb: Testbed, gpus: list[str], every: int, iterations: int) -> dict:
    """One job on `gpus` (placed under one switch from the rack file's cabling) run to its end; its iteration times
    and its saves."""
    client = tb.client
    client.put("/ocs/circuits", {"circuits": CircuitMap.initial(tb.rack).to_json()})
    jid = client.post("/jobs", {"gpus": gpus, "policy": "regroup", "checkpoint_every": every,
                                "workload": {"iterations": iterations}})["job"]["id"]
    ended = ("done", "failed", "stopped")
    j = wait_for(lambda: (j := client.get(f"/jobs/{jid}")["job"])["state"] in ended and j, 900, f"{jid} to end")
    if j["state"] != "done" or j["iterations_done"] != iterations:
        raise RuntimeError(f"{jid} ended {j['state']} after {j['iterations_done']} iterations: {j['reason']}")
    saves = [r for g in j["gpus"] for r in j["checkpoints"][g] if r["event"] == "checkpoint"]
    its = [i["iter_s"] for i in j["iteration_log"][1:]]
    return {"job": jid, "checkpoint_every": every, "mean_iteration_s": statistics.fmean(its), "saves": len(saves),
            "local_s": [r["local_s"] for r in saves], "save_s": [r["save_s"] for r in saves],
            "bytes": saves[0]["bytes"] if saves else 0, "switches": j["switches"]}


def checkpoint_cost(args) -> int:
    rack = load_rack(args.rack)
    gpus = args.gpus.split(",")
    never = args.iterations + 1
    print(f"checkpoint cost: {len(gpus)} GPUs ({args.gpus}), {args.iterations} iterations, K = {args.checkpoint_every}"
          f" against none, {args.pairs} pairs", flush=True)
    pairs = []
    with tempfile.TemporaryDirectory() as tmp, Testbed(rack, args.rack, Path(tmp)) as tb:
        for i in range(args.pairs):
            # each first in turn
            order = (args.checkpoint_every, never) if i % 2 == 0 else (never, args.checkpoint_every)
            runs = [run_to_end(tb, gpus, k, args.iterations) for k in order]
            saving, plain = sorted(runs, key=lambda r: r["checkpoint_every"])
            cost = saving["mean_iteration_s"] / plain["mean_iteration_s"] - 1
            held = sum(saving["local_s"]) / len(gpus) / ((args.iterations - 1) * saving["mean_iteration_s"])
            pairs.append({"with": saving, "without": plain, "cost": cost, "held_share": held})
            print(f"  pair {i + 1}: mean iteration {saving['mean_iteration_s']:.4f} s with K = "
                  f"{args.checkpoint_every}, {plain['mean_iteration_s']:.4f} s without: {100 * cost:+.2f} %; "
                  f"{saving['saves']} saves of {saving['bytes']} B, local {statistics.median(saving['local_s']):.4f} s"
                  f" (loop held {100 * held:.2f} %), to the peer {statistics.median(saving['save_s']):.3f} s (median)",
                  flush=True)
    median = {
        "cost": statistics.median(p["cost"] for p in pairs),
        "held_share": statistics.median(p["held_share"] for p in pairs),
        "local_s": statistics.median(x for p in pairs for x in p["with"]["local_s"]),
        "save_s": statistics.median(x for p in pairs for x in p["with"]["save_s"]),
        "mean_iteration_s_with": statistics.median(p["with"]["mean_iteration_s"] for p in pairs),
        "mean_iteration_s_without": statistics.median(p["without"]["mean_iteration_s"] for p in pairs),
    }
    print("median: " + ", ".join(f"{k} {v:.4f}" for k, v in median.items()))
    write_json(args.json, {"mode": "checkpoint-cost", "gpus": gpus, "iterations": args.iterations,
                           "checkpoint_every": args.checkpoint_every, "pairs": pairs, "median": median})
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5, help="servers killed, one per round (default %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help=f"the job's K (default 1: every iteration; --checkpoint-cost: {DEFAULT_CHECKPOINT_EVERY}, "
                   "the controller's)")
    p.add_argument("--kill-after", type=int, default=14, help="iterations before the kill (default %(default)s)")
    p.add_argument("--iterations", type=int, default=30, help="the job's iterations; it runs to its end")
    p.add_argument("--fault", choices=FAULTS, default="server",
                   help="what strikes the job (see above): a server killed, a worker killed, a cascade, a server hung, "
                   "or the controller killed at each step of a recovery (default %(default)s)")
    c = p.add_argument_group("--checkpoint-cost")
    c.add_argument("--checkpoint-cost", action="store_true", help="measure what saving checkpoints costs (see above)")
    c.add_argument("--pairs", type=int, default=3, help="jobs with and without checkpoints (default %(default)s)")
    p.add_argument("--rack", type=Path, default=RACK_FILE,
                   help="the rack file (default %(default)s; e.g. topologies/trace16.yaml, 16 GPUs of two models)")
    p.add_argument("--gpus", default=",".join(JOB_GPUS),
                   help="the job's GPUs, of one model for spares of its model (default %(default)s); the faults strike "
                   "the servers of all but the first")
    add_json_option(p)
    args = p.parse_args(argv)
    gpus = args.gpus.split(",")
    try:
        unknown = sorted(set(gpus) - set(load_rack(args.rack).gpus))
    except Exception as e:  # noqa: BLE001 (a rack file that does not load: its error names the file and field)
        p.error(f"--rack: {e}")
    if unknown:
        p.error(f"--gpus: {', '.join(unknown)} not in {args.rack.name}")
    if args.checkpoint_every is None:
        args.checkpoint_every = DEFAULT_CHECKPOINT_EVERY if args.checkpoint_cost else 1
    if args.checkpoint_cost:
        if args.pairs < 1 or args.checkpoint_every < 1 or args.iterations <= args.checkpoint_every:
            p.error("--pairs and --checkpoint-every take positive integers, and --iterations more than K")
        return checkpoint_cost(args)
    if min(args.rounds, args.checkpoint_every, args.kill_after) < 1 or args.iterations <= args.kill_after:
        p.error("--rounds, --checkpoint-every and --kill-after take positive integers, and --iterations more than "
                "--kill-after")
    rack = load_rack(args.rack)
    plans = {pl.server: pl for pl in engines.engine_plans(rack)}
    rows = []
    victims = victims_of(rack, gpus, args.fault)
    print(f"failover: fault {args.fault} under a {len(gpus)}-GPU job on {args.rack.name}, {args.rounds} rounds",
          flush=True)
    with tempfile.TemporaryDirectory() as tmp, Testbed(rack, args.rack, Path(tmp)) as tb:
        for i in range(args.rounds):
            victim = victims[i % len(victims)]
            try:
                r = one_round(tb, plans, victim, args.checkpoint_every, args.kill_after, args.iterations, args.fault, i,
                              gpus)
            except (TimeoutError, RuntimeError) as e:  # a round that did not recover: kept, with what explains it
                r = failed_round(tb, plans, victim, i + 1, e)
                rows.append(r)
                print(f"  round {i + 1}: {victim} killed: FAILED ({e}); its job, its ranks' logs and the controller's "
                      f"log are in {r['diagnostics']}", flush=True)
                continue
            rows.append(r)
            print(
                f"  round {i + 1}: {r['killed']} killed, {r['lost']} -> {r['spares']}: all ranks iterating again "
                f"after {r['total_s']:.2f} s (" + ", ".join(f"{k[:-2]} {r[k]:.2f}" for k in PHASES)
                + f"), from iteration {r['resumed_from']}, {r['iterations_redone']} redone; {r['state']} after "
                f"{r['iterations_done']} iterations, {r['recoveries']} recovery",
                flush=True,
            )
    keys = ("total_s", *PHASES, "iterations_redone", "mean_iteration_s")
    good = [r for r in rows if "failed" not in r]
    if not good:
        print("no round recovered", file=sys.stderr)
        return 1
    if args.fault == "restart":
        keys = (*keys, "back_s")
    median = {k: statistics.median(r[k] for r in good) for k in keys}
    p99 = {k: percentile([r[k] for r in good], 99) for k in keys}
    worst = {k: max(r[k] for r in good) for k in keys}  # with tens of rounds, the worst one: named so, not p99
    print(f"{'phase':<12} {'p50 s':>7} {f'max of {len(good)}':>10}")
    for k in ("total_s", *PHASES, *(("back_s",) if args.fault == "restart" else ())):
        print(f"{LABELS.get(k, 'from the restart'):<12} {median[k]:>7.3f} {worst[k]:>10.3f}")
    print(f"iterations redone: p50 {median['iterations_redone']:g}, max {max(r['iterations_redone'] for r in good)};"
          f" warm spares used in {sum(all(r['warm'].values()) and bool(r['warm']) for r in good)}/{len(rows)} rounds;"
          f" {len(rows) - len(good)} round(s) did not recover")
    print("median: " + ", ".join(f"{k} {v:.2f}" for k, v in median.items()))
    write_json(args.json, {"fault": args.fault, "rounds": rows, "median": median, "p99": p99, "max": worst})
    bad = [str(r["job"]) for r in rows if r["state"] != "done" or r["recoveries"] != 1]
    if bad:
        print(f"not done after one recovery: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
