#!/usr/bin/env python3
"""Replay a trace on the emulated rack: every job submitted through the REST API at its arrival time, under
each placement policy, and every job's submit, admission (GPUs granted), start, end, placement, circuit changes
and iterations recorded (the emulated side of the simulator's trace check; `python -m evidence.tracecheck RECORD` sets
it beside the simulator's run of the same trace on the same rack file).

    python scripts/replay_trace.py                        # traces/trace16.csv on topologies/trace16.yaml
    python scripts/replay_trace.py --jobs 5 --policies fixed --no-record   # a short slice
    python scripts/replay_trace.py --trace traces/trace16-bursty.csv --queue backfill   # the controller's backfill

For each policy a fresh testbed (controller + rack, the rack file's cabling) is brought up, the trace's jobs are
submitted at their arrival times (rack seconds x the rack's time dilation, from the first submission) with
`queue: true` (after the host's probe: PROBE's jobs, each alone on the idle testbed, their rows kept in the
record as the policy run's `probe`, so that a model of the host can be charged at that day's speed; `--no-probe`:
none), and the replay waits until every job has ended; then the rack is taken down. `fixed` and `regroup`
are the jobs' placement policies; `defrag` submits with `regroup` and posts `POST /regroup` every
`--defrag-interval` rack seconds while jobs run, as the simulator's defrag policy does. `--queue backfill` (or
`sjf`) starts the controller with that queue discipline and sends each job's `estimate_s`: the simulator's
estimate of the job's run time while it waits (evidence/tracecheck.py's `estimates`, times the time dilation); the
record's policy runs name the discipline (`scheduler`), which the trace check then simulates. Each job saves no
checkpoint (K beyond its last iteration), as the demo's jobs. Times in the record are rack seconds from the
first submission.

Needs root (it brings the rack up); run it under `flock /tmp/optirack-rack.lock`. Writes a new record
`results/replay/<UTC start>-<commit>.json` (never overwriting one; `--no-record`: none) and, with
`--json PATH`, the same record to PATH.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a file: the project's packages from this checkout
    sys.path.insert(0, str(ROOT))

from controller.client import ApiError  # noqa: E402
from controller.core.rack import RackError, load_rack  # noqa: E402
from emulation import ovs  # noqa: E402
from emulation.netns import NetnsError  # noqa: E402
from evidence import fingerprint, modelhash, records, tracecheck  # noqa: E402
from simulator.inputs.workloads import TraceError, read_trace  # noqa: E402

RACK_FILE = ROOT / "topologies" / "trace16.yaml"
TRACE_FILE = ROOT / "traces" / "trace16.csv"
POLICIES = ("fixed", "regroup", "defrag")
QUEUES = ("fifo", "backfill", "sjf")  # the controller's queue disciplines (--optirack-queue)
PLACEMENT = {"fixed": "fixed", "regroup": "regroup", "defrag": "regroup"}
DEFRAG_INTERVAL_S = 30.0  # rack seconds between defragmentation rounds (simulate with --defrag-interval 30)
ENDED = ("done", "failed", "stopped")
RACK_UP_TRIES = 3
JOB_TIMEOUT_S = 600.0  # emulated seconds a replay may run beyond its last arrival, per job of the trace
# The host's probe: before each policy's trace, these jobs run one after another, each alone on the idle testbed, so
# that the record says how fast this host did a job's container start, its start (torch's import, the ring's
# rendezvous) and its iterations that day, apart from the trace's jobs (the same rack was about 2x faster at starts
# on 2026-12-06 than on 2026-11-29): a model of the loaded host can be charged in the host's own units.
PROBE = ({"gpus": 1, "model": "resnet50", "iterations": 20}, {"gpus": 2, "model": "vgg16", "iterations": 10})
PROBE_TIMEOUT_S = 180.0  # emulated seconds one probe job may take


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- pure parts (unit-tested) ---------------------------------------------------------------------------------
def request(index: int, job: dict, policy: str, estimate_s: float | None = None,
            warm_spares: int | None = None) -> dict:
    """The REST body that submits the trace's job `index` (0-based) under `policy`, with its `estimate_s` (emulated
    seconds) where the controller's queue needs one, and its `warm_spares` where given (else the controller's
    default)."""
    body = {"name": f"trace j{index + 1}", "gpus": job["gpus"], "policy": PLACEMENT[policy],
            "workload": {"model": job["model"], "iterations": job["iterations"]},
            "checkpoint_every": job["iterations"], "queue": True}  # no save within the job, as the demo's
    return _given(body, estimate_s=estimate_s, warm_spares=warm_spares)


def probe_request(index: int, job: dict, estimate_s: float | None = None, warm_spares: int | None = None) -> dict:
    """The REST body of the host's probe job `index`: placed where it is cabled (no circuit changes), no save; with
    `estimate_s` where the controller's queue needs one (backfill, sjf), and `warm_spares` as the trace's jobs."""
    body = {"name": f"probe {index + 1}", "gpus": job["gpus"], "policy": "fixed",
            "workload": {"model": job["model"], "iterations": job["iterations"]},
            "checkpoint_every": job["iterations"], "queue": True}
    return _given(body, estimate_s=estimate_s, warm_spares=warm_spares)


def _given(body: dict, **fields) -> dict:
    """`body` with each of `fields` that is not None (the rest left to the controller's defaults)."""
    return {**body, **{k: v for k, v in fields.items() if v is not None}}


def due(trace: list[dict], submitted: int, elapsed_s: float, dilation: float) -> list[int]:
    """Indices of the jobs not yet submitted whose arrival (rack s) has come at `elapsed_s` emulated seconds."""
    return [i for i in range(submitted, len(trace)) if trace[i]["arrival_s"] * dilation <= elapsed_s]


def changes(event: dict) -> int:
    """Circuits one reconfiguration changed: removed plus added (the simulator's count)."""
    return len(event.get("removed") or []) + len(event.get("added") or [])


def job_row(index: int, spec: dict, job: dict, events: dict[int, dict], t0: float, dilation: float) -> dict:
    """One job of the replay: what the trace asked, what the controller did, times in rack s from `t0`."""
    def rack_s(t: float | None) -> float | None:
        return None if t is None else (t - t0) / dilation

    its = job.get("iteration_log") or []
    first = min((it["t_start"] for it in its), default=None)
    iters = [it["iter_s"] for it in its]
    return {
        "index": index, "id": job["id"], "gpus_asked": spec["gpus"], "model": spec["model"],
        "iterations": spec["iterations"], "arrival_s": spec["arrival_s"], "state": job["state"],
        "reason": job.get("reason"), "submit_s": rack_s(job.get("created_at")),
        "admit_s": rack_s(job.get("admitted_at")), "start_s": rack_s(job.get("started_at")),
        "first_iteration_s": rack_s(first), "end_s": rack_s(job.get("ended_at")), "gpus": job.get("gpus") or [],
        "switches": job.get("switches") or [], "circuits": job.get("circuits") or [],
        "events": list(job.get("events") or []),
        "circuit_changes": sum(changes(events[e]) for e in job.get("events") or [] if e in events),
        "iterations_done": job.get("iterations_done"),
        "mean_iteration_s": statistics.mean(iters) / dilation if iters else None,
        "note": job.get("note"),
    }


def summary(rows: list[dict], events: list[dict]) -> dict:
    done = [r for r in rows if r["state"] == "done"]
    return {"jobs": len(rows), "done": len(done),
            "makespan_s": max((r["end_s"] for r in rows if r["end_s"] is not None), default=None),
            "mean_jct_s": statistics.mean(r["end_s"] - r["submit_s"] for r in done) if done else None,
            "mean_queue_s": statistics.mean(r["start_s"] - r["submit_s"] for r in done) if done else None,
            "circuit_changes": sum(changes(e) for e in events)}


# --- on the rack ----------------------------------------------------------------------------------------------
def probe(client, dilation: float, queue: str = "fifo", warm_spares: int | None = None) -> list[dict]:
    """The host's probe (PROBE), each job alone, in turn; each its job row (rack s from its own submission). A
    probe job that does not end done fails the replay: the host is not fit to replay on. Under a queue that needs
    estimates (backfill, sjf) each is sent its time bound, PROBE_TIMEOUT_S: alone on the rack, it orders nothing."""
    rows = []
    estimate = None if queue == "fifo" else PROBE_TIMEOUT_S
    for i, spec in enumerate(PROBE):
        t0 = time.time()
        jid = client.post("/jobs", probe_request(i, spec, estimate, warm_spares))["job"]["id"]
        while True:
            job = client.get(f"/jobs/{jid}")["job"]
            if job["state"] in ENDED:
                break
            if time.time() - t0 > PROBE_TIMEOUT_S:
                raise TimeoutError(f"probe {i + 1} ({spec['gpus']} x {spec['model']}) still {job['state']} after "
                                   f"{PROBE_TIMEOUT_S:.0f} s")
            time.sleep(0.2)
        if job["state"] != "done":
            raise RuntimeError(f"probe {i + 1} ({spec['gpus']} x {spec['model']}) ended {job['state']}: "
                               f"{job.get('reason')}")
        rows.append(job_row(i, {**spec, "arrival_s": 0.0}, job, {}, job["created_at"], dilation))
    return rows


def replay(rack_file: Path, trace: list[dict], policy: str, defrag_s: float, workdir: Path, queue: str = "fifo",
           estimates: list[float] | None = None, probing: bool = True, warm_spares: int | None = None) -> dict:
    """One policy's replay on a fresh testbed whose controller queues by `queue`, each job sent its estimate
    (`estimates`, rack s) where given and `warm_spares` where given, after the host's probe (`probing`); the testbed
    is taken down, pass or fail."""
    from emulation.harness import Testbed

    rack = load_rack(rack_file)
    dilation = rack.spec.emulation.time_dilation
    deadline_s = trace[-1]["arrival_s"] * dilation + JOB_TIMEOUT_S * len(trace)
    started = time.time()
    for attempt in range(1, RACK_UP_TRIES + 1):  # Mininet's controller check reads the OpenFlow hello as UTF-8 and
        try:                                     # now and then fails on its bytes: the rack-up is tried again
            tb = Testbed(rack, rack_file, workdir / f"{policy}-{attempt}", ["--optirack-queue", queue]).__enter__()
            break
        except UnicodeDecodeError as exc:
            log(f"  {policy}: rack-up failed ({exc}); try {attempt} of {RACK_UP_TRIES}")
            if attempt == RACK_UP_TRIES:
                raise
    try:
        log(f"  {policy}: testbed up in {time.time() - started:.0f} s")
        up = time.time()
        probed = probe(tb.client, dilation, queue, warm_spares) if probing else None
        if probed:
            log(f"  {policy}: the host's probe: " + "; ".join(
                f"{r['gpus_asked']} x {r['model']} containers {r['start_s'] - r['admit_s']:.2f}, start "
                f"{r['first_iteration_s'] - r['start_s']:.2f}, iteration {r['mean_iteration_s']:.3f} rack s"
                for r in probed))
        log(f"  {policy}: submitting {len(trace)} jobs")
        first_event = max((e["id"] for e in tb.client.get("/events", limit=1)["events"]), default=0)
        ids: list[str] = []
        rounds: list[dict] = []
        t0 = time.time()
        next_round = defrag_s * dilation if policy == "defrag" else float("inf")
        last_report = 0.0
        while True:
            elapsed = time.time() - t0
            for i in due(trace, len(ids), elapsed, dilation):
                estimate = None if estimates is None else estimates[i] * dilation
                ids.append(tb.client.post("/jobs", request(i, trace[i], policy, estimate, warm_spares))["job"]["id"])
            states = {j["id"]: j["state"] for j in tb.client.get("/jobs", limit=1000)["jobs"] if j["id"] in ids}
            running = [i for i in ids if states.get(i) not in ENDED]
            if elapsed >= next_round:
                next_round += defrag_s * dilation
                if running:
                    try:
                        r = tb.client.post("/regroup")
                        rounds.append({"at_s": elapsed / dilation, "moved": len(r.get("jobs_moved", [])),
                                       "circuits_changed": r.get("circuits_changed", 0)})
                    except ApiError as exc:  # another reconfiguration under way: this round is skipped
                        rounds.append({"at_s": elapsed / dilation, "skipped": str(exc)})
            if len(ids) == len(trace) and not running:
                break
            if elapsed > deadline_s:
                raise TimeoutError(f"{policy}: {len(running)} jobs still running after {elapsed:.0f} s")
            if elapsed - last_report > 30:
                last_report = elapsed
                log(f"  {policy}: {elapsed:.0f} s, {len(ids)}/{len(trace)} submitted, {len(running)} not ended")
            time.sleep(0.5)
        wall = time.time() - t0
        events = [e for e in tb.client.get("/events", limit=1000)["events"] if e["id"] > first_event]
        by_id = {e["id"]: e for e in events}
        rows = [job_row(i, trace[i], tb.client.get(f"/jobs/{jid}")["job"], by_id, t0, dilation)
                for i, jid in enumerate(ids)]
    finally:
        tb.__exit__(None, None, None)  # the rack down and the controller stopped, pass or fail
    out = {"policy": policy, "placement": PLACEMENT[policy], "scheduler": queue, "estimates_rack_s": estimates,
           "testbed_up_s": up - started, "probe": probed, "replay_wall_s": wall,
           "defrag_interval_s": defrag_s if policy == "defrag" else None, "defrag_rounds": rounds,
           "jobs": rows, "events": [{k: e.get(k) for k in ("id", "kind", "job", "requested_at", "removed", "added",
                                                          "status")} for e in events]}
    out["summary"] = summary(rows, events)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="replay_trace.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rack", type=Path, default=RACK_FILE, help="rack file (%(default)s)")
    ap.add_argument("--trace", type=Path, default=TRACE_FILE, help="CSV trace (%(default)s)")
    ap.add_argument("--jobs", type=int, help="replay only the first N jobs of the trace")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated, of %(default)s")
    ap.add_argument("--defrag-interval", type=float, default=DEFRAG_INTERVAL_S,
                    help="defrag: rack seconds between rounds (%(default)s)")
    ap.add_argument("--queue", default="fifo", help=f"the controller's queue discipline, of {', '.join(QUEUES)} "
                    "(%(default)s); backfill and sjf send each job's estimate, the simulator's")
    ap.add_argument("--warm-spares", type=int, metavar="N",
                    help="each job's (and probe's) warm spares per GPU model and switch (default: not sent, the "
                         "controller's default, 1); 0 keeps no worker started on a free GPU beside the jobs, which the "
                         "simulator does not model")
    ap.add_argument("--results", type=Path, default=ROOT / "results", help="the record goes to DIR/replay/")
    ap.add_argument("--no-probe", action="store_true", help="no host's probe before each policy's trace (PROBE: "
                    "a few jobs alone on the idle testbed, about 20 s)")
    ap.add_argument("--no-record", action="store_true", help="write no record under --results")
    ap.add_argument("--json", type=Path, metavar="PATH", help="also write the record to PATH")
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    try:
        bad = [p for p in policies if p not in POLICIES]
        if bad or not policies:
            raise ValueError(f"--policies: unknown {', '.join(bad) or '(none)'} (choose from {', '.join(POLICIES)})")
        if args.queue not in QUEUES:
            raise ValueError(f"--queue: unknown {args.queue!r} (choose from {', '.join(QUEUES)})")
        if args.jobs is not None and args.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, not {args.jobs}")
        if args.warm_spares is not None and args.warm_spares < 0:
            raise ValueError(f"--warm-spares must be 0 or more, not {args.warm_spares}")
        if not args.defrag_interval > 0:
            raise ValueError(f"--defrag-interval must be positive, not {args.defrag_interval}")
        rack = load_rack(args.rack)
        specs = read_trace(args.trace)
        ovs.bridges()  # Open vSwitch answers, before anything is started
    except (ValueError, RackError, TraceError, OSError, NetnsError) as exc:
        print(f"replay_trace: {exc}", file=sys.stderr)
        return 2
    trace = [{"arrival_s": j.arrival_s, "gpus": j.gpus, "model": j.model, "iterations": j.iterations}
             for j in sorted(specs, key=lambda j: j.arrival_s)][: args.jobs]
    too_big = [i + 1 for i, j in enumerate(trace) if j["gpus"] > len(rack.gpus)]
    if too_big:
        print(f"replay_trace: jobs {too_big} ask for more GPUs than the rack's {len(rack.gpus)}", file=sys.stderr)
        return 2
    estimates = None if args.queue == "fifo" else tracecheck.estimates(args.rack, trace)
    commit, dirty = records.git_state()
    started_utc = records.utc_stamp()
    record = {"kind": "trace replay", "started_utc": started_utc, "model_fingerprint": fingerprint.current(),
              "model_hash": modelhash.model_hash(),
              "rack_file": str(args.rack.resolve().relative_to(ROOT)) if args.rack.resolve().is_relative_to(ROOT)
              else str(args.rack), "rack_sha256": hashlib.sha256(args.rack.read_bytes()).hexdigest(),
              "trace_file": str(args.trace), "trace_sha256": hashlib.sha256(args.trace.read_bytes()).hexdigest(),
              "jobs_replayed": len(trace), "time_dilation": rack.spec.emulation.time_dilation,
              "warm_spares": args.warm_spares,  # None: the controller's default
              "versions": records.versions(full=True), "policies": {}}
    t = time.time()
    with tempfile.TemporaryDirectory(prefix="optirack-replay-") as tmp:
        for policy in policies:
            log(f"replaying {len(trace)} jobs under {policy}")
            record["policies"][policy] = replay(args.rack, trace, policy, args.defrag_interval, Path(tmp), args.queue,
                                                estimates, not args.no_probe, args.warm_spares)
            s = record["policies"][policy]["summary"]
            log(f"  {policy}: {s['done']}/{s['jobs']} done, makespan {s['makespan_s']:.1f} rack s, "
                f"{s['circuit_changes']} circuit changes, replay {record['policies'][policy]['replay_wall_s']:.0f} s")
    record["wall_s"] = time.time() - t
    if modelhash.model_hash() != record["model_hash"]:
        record["model_hash_at_start"], record["model_hash"] = record["model_hash"], None
        record["model_fingerprint_at_start"], record["model_fingerprint"] = record["model_fingerprint"], None
    text = json.dumps(record, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
        log(f"wrote {args.json}")
    if not args.no_record:
        path = records.write_new(args.results / "replay" / f"{records.stem(started_utc, commit, bool(dirty))}.json",
                                 record)
        log(f"wrote {path}")
    for policy, run in record["policies"].items():
        s = run["summary"]
        print(f"{policy}: {s['done']}/{s['jobs']} jobs done, makespan {s['makespan_s']:.1f} rack s, mean JCT "
              f"{s['mean_jct_s'] or float('nan'):.1f} s, mean queueing {s['mean_queue_s'] or float('nan'):.1f} s, "
              f"{s['circuit_changes']} circuit changes, {run['replay_wall_s']:.0f} s to replay")
    return 0 if all(r["summary"]["done"] == r["summary"]["jobs"] for r in record["policies"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
