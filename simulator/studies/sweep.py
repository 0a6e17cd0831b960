"""`optirack sweep`: a study grid (placement policies x schedulers x failure recoveries x loads x seeds) run in
parallel on Dask's distributed scheduler, one simulated run per task, and one table of the means with 95 % intervals
over the seeds. The failure axis (`--failures none,swap,...`) runs each cell with server failures and that recovery
(simulator/model/failures.py, as `optirack simulate --failures`), and the table gives its goodput.

A task carries only its settings (rack shape, workload, policy, scheduler, load, seed); the worker builds the rack
and the synthetic jobs itself, runs the engine and returns a few figures, so little crosses the network. A local
cluster is started by default (`--workers`, `--threads`); `--scheduler tcp://HOST:PORT` sends the tasks to a running
Dask scheduler whose workers have optirack installed.
"""
from __future__ import annotations

import itertools
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from controller.core import admission
from simulator.model import failures as failure
from simulator.studies.sweepout import FIGURES, markdown, write

# Job-size mixes (`--mixes`): GPUs per job, 2^k, with their weights. field: the synthetic jobs' own
# (simulator/inputs/workloads.py SIZE_WEIGHTS, 1-128 GPUs); small: jobs of at most 8 GPUs, which fit under one switch;
# large: jobs of 16-128 GPUs, which span switches unless regrouped.
MIXES = {"field": None, "small": {1: 0.3, 2: 0.3, 4: 0.25, 8: 0.15}, "large": {16: 0.4, 32: 0.3, 64: 0.2, 128: 0.1}}


@dataclass(frozen=True)
class Task:
    gpus: int
    gpus_per_switch: int
    gpus_per_server: int
    oversubscription: float
    spare: float
    models: str
    jobs: int
    policy: str
    scheduler: str
    load: float
    seed: int
    defrag_interval: float = 300.0
    failures: str = "none"  # none, or the recovery of simulator/model/failures.py
    server_mtbf_h: float = failure.MTBF_H
    repair_h: float = failure.REPAIR_H
    swap_s: float = failure.SWAP_S
    restart_s: float = failure.RESTART_S
    checkpoint_s: float = failure.CHECKPOINT_S
    mix: str = "field"  # the job-size mix (MIXES)

    def failure_model(self) -> failure.Failures | None:
        if self.failures == "none":
            return None
        return failure.Failures(self.failures, self.server_mtbf_h * 3600, self.repair_h * 3600, self.swap_s,
                                 self.restart_s, self.checkpoint_s, self.seed)


def run_task(task: Task) -> dict:
    """One simulated run (on a Dask worker): its settings and its figures."""
    from profiles import WORKLOADS
    from simulator.cli.main import _typical_iteration
    from simulator.inputs import workloads
    from simulator.model import engine
    from simulator.studies import metrics

    rack = _rack(task)
    per = {m: _typical_iteration(rack, m) for m in WORKLOADS}
    jobs = mixed_jobs(task, len(rack.gpus), per) if MIXES[task.mix] else \
        workloads.synthetic(task.jobs, task.seed, len(rack.gpus), per, task.load)
    policy = engine.with_recovery(engine.with_scheduler(engine.policies(task.defrag_interval)[task.policy],
                                                        task.scheduler), task.failures)
    t0 = time.monotonic()
    result = engine.Run(rack, jobs, policy, engine.Options(failures=task.failure_model())).run()
    s = metrics.summary(result, len(rack.gpus), time.monotonic() - t0)
    row = asdict(task) | {"run": policy.name}
    for name, (key, sub, _) in FIGURES.items():
        row[name] = metrics.pick(s, key, sub)
    row["preemptions"] = sum(j.preemptions for j in result.jobs)
    row["server_failures"], row["interruptions"] = result.failures, sum(j.interruptions for j in result.jobs)
    row["wall_s"] = s["wall_s"]
    return row


def mixed_jobs(task: Task, rack_gpus: int, iteration_s: dict[str, float]) -> list:
    """Synthetic jobs drawn as simulator.inputs.workloads.synthetic draws them (one seeded generator: size, model,
    log-uniform iterations; Poisson arrivals offering `task.load`), with the sizes of the mix `task.mix`."""
    import math
    import random

    from simulator.inputs import workloads

    mix = {n: w for n, w in MIXES[task.mix].items() if n <= rack_gpus}
    if not mix:
        raise ValueError(f"--mixes: {task.mix} has no job size within the rack's {rack_gpus} GPUs")
    rng = random.Random(task.seed)
    models, model_weights = zip(*workloads.MODEL_WEIGHTS, strict=True)
    lo, hi = map(math.log, workloads.ITERATIONS)
    drawn = [(rng.choices(list(mix), list(mix.values()))[0], rng.choices(models, model_weights)[0],
              max(1, round(math.exp(rng.uniform(lo, hi))))) for _ in range(task.jobs)]
    rate = task.load * rack_gpus / (sum(n * it * iteration_s[m] for n, m, it in drawn) / task.jobs)
    t, out = 0.0, []
    for i, (n, model, iterations) in enumerate(drawn):
        out.append(workloads.JobSpec(f"j{i + 1}", round(t, 6), n, model, iterations))
        t += rng.expovariate(rate)
    return out


_RACKS: dict = {}  # per worker process: racks built, by shape


def _rack(task: Task):
    from simulator.inputs import racks

    key = (task.gpus, task.gpus_per_switch, task.gpus_per_server, task.oversubscription, task.spare, task.models)
    if key not in _RACKS:
        _RACKS[key] = racks.generate(racks.RackOptions(
            task.gpus, task.gpus_per_switch, task.gpus_per_server, task.oversubscription,
            models=racks.parse_models(task.models), spare=task.spare))
    return _RACKS[key]


def grid(args) -> list[Task]:
    policies = _names(args.policies, "--policies")
    schedulers = _names(args.schedulers, "--schedulers")
    from simulator.model import engine

    known = engine.policies(args.defrag_interval)
    bad = [p for p in policies if p not in known]
    if bad:
        raise ValueError(f"--policies: unknown {', '.join(bad)} (known: {', '.join(known)})")
    bad = [s for s in schedulers if s not in admission.POLICIES]
    if bad:
        raise ValueError(f"--schedulers: unknown {', '.join(bad)} (known: {', '.join(admission.POLICIES)})")
    loads = []
    for text in _names(args.loads, "--loads"):
        try:
            load = float(text)
        except ValueError:
            raise ValueError(f"--loads: {text!r} is not a number") from None
        if not 0 < load < float("inf"):
            raise ValueError(f"--loads: {text} must be a positive load")
        loads.append(load)
    recoveries = _names(args.failures, "--failures")
    bad = [f for f in recoveries if f != "none" and f not in failure.RECOVERIES]
    if bad:
        raise ValueError(f"--failures: unknown {', '.join(bad)} (known: none, {', '.join(failure.RECOVERIES)})")
    shape = dict(server_mtbf_h=args.server_mtbf_h, repair_h=args.repair_h, swap_s=args.swap_s,
                 restart_s=args.restart_s, checkpoint_s=args.checkpoint_s)
    from simulator.cli.flags import check_failure_flags

    check_failure_flags(args)  # in the unit each flag is given in
    failure.Failures("swap", args.server_mtbf_h * 3600, args.repair_h * 3600, args.swap_s, args.restart_s,
                      args.checkpoint_s).check()  # refuse a bad setting, naming its flag
    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, not {args.seeds}")
    if args.jobs < 1:
        raise ValueError(f"--jobs must be at least 1, not {args.jobs}")
    from simulator.inputs import racks

    racks.parse_models(args.models)
    oversubs = [args.oversubscription]
    if getattr(args, "oversubscriptions", None):
        try:
            oversubs = [float(t) for t in _names(args.oversubscriptions, "--oversubscriptions")]
        except ValueError as e:
            raise ValueError(f"--oversubscriptions: {e}") from None
    mixes = _names(getattr(args, "mixes", None) or "field", "--mixes")
    bad = [m for m in mixes if m not in MIXES]
    if bad:
        raise ValueError(f"--mixes: unknown {', '.join(bad)} (known: {', '.join(MIXES)})")
    for o in oversubs:
        racks.generate(racks.RackOptions(args.gpus, args.gpus_per_switch, args.gpus_per_server, o,
                                         models=racks.parse_models(args.models), spare=args.spare))  # a bad shape
    seeds = range(args.seed, args.seed + args.seeds)
    return [Task(args.gpus, args.gpus_per_switch, args.gpus_per_server, o, args.spare,
                 args.models, args.jobs, p, s, load, seed, args.defrag_interval, f, **shape, mix=m)
            for o, m, p, s, f, load, seed in itertools.product(oversubs, mixes, policies, schedulers, recoveries,
                                                               loads, seeds)]


def _names(text: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"{flag}: none given")
    if len(set(names)) != len(names):
        raise ValueError(f"{flag}: {text!r} names one twice")
    return names


def run_grid(tasks: list[Task], scheduler: str | None = None, workers: int = 2, threads: int = 1,
             processes: bool = True, progress=None) -> list[dict]:
    """Every task on Dask: the user's scheduler at `scheduler`, else a local cluster of `workers` x `threads`."""
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = None
    if scheduler:
        client = Client(scheduler, timeout="10s")
    else:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=threads, processes=processes,
                               dashboard_address=None, silence_logs=40)
        client = Client(cluster)
    try:
        futures = client.map(run_task, tasks, pure=False)
        rows = []
        for i, fut in enumerate(as_completed(futures), 1):
            rows.append(fut.result())
            if progress:
                progress(i, len(tasks))
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    key = {t: i for i, t in enumerate(tasks)}
    return sorted(rows, key=lambda r: key[Task(**{k: r[k] for k in Task.__dataclass_fields__})])


def study(rows: list[dict]) -> list[dict]:
    """Per run (policy+scheduler+recovery) and load: each figure's mean and 95 % interval over the seeds."""
    from simulator.studies import metrics

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["run"], r["policy"], r["scheduler"], r["failures"], r["load"], r.get("oversubscription"),
               r.get("mix", "field"))
        groups.setdefault(key, []).append(r)
    out = []
    for (run, policy, scheduler, recovery, load, oversub, mix), rs in groups.items():
        row = {"run": run, "policy": policy, "scheduler": scheduler, "failures": recovery, "load": load,
               "oversubscription": oversub, "mix": mix, "seeds": len(rs)}
        for name in FIGURES:
            iv = metrics.interval([r[name] for r in rs])
            row[name], row[name + "_ci95"] = iv["mean"], iv["ci95"]
        out.append(row)
    return out


def add_parser(sub) -> None:
    p = sub.add_parser(
        "sweep", help="run a study grid of simulations (policies x schedulers x failures x loads x seeds) on Dask",
        description="Simulate every combination of placement policy, scheduler, failure recovery, offered load and "
                    "seed on a generated rack, in parallel on Dask's distributed scheduler (a local cluster, or "
                    "--scheduler ADDRESS), and write the study table (means, 95 % intervals over the seeds) and "
                    "its plots to --out.",
        epilog="Example: optirack sweep --gpus 256 --jobs 300 --policies fixed,regroup --schedulers fifo,backfill "
               "--loads 0.5,0.7,0.9 --seeds 3 --out sweep-256")
    p.add_argument("--gpus", type=int, default=256, help="GPUs of the generated rack (%(default)s)")
    p.add_argument("--gpus-per-switch", type=int, default=32, help="(%(default)s)")
    p.add_argument("--gpus-per-server", type=int, default=8, help="(%(default)s)")
    p.add_argument("--oversubscription", type=float, default=16.0, help="(%(default)s)")
    p.add_argument("--spare", type=float, default=2.0, help="(%(default)s)")
    p.add_argument("--models", default="V100:0.5,A100:0.5", help="(%(default)s)")
    p.add_argument("--jobs", type=int, default=300, help="synthetic jobs per run (%(default)s)")
    p.add_argument("--policies", default="fixed,regroup", help="placement policies (%(default)s)")
    p.add_argument("--schedulers", default="fifo,backfill",
                   help=f"admission policies, of {', '.join(admission.POLICIES)} (%(default)s)")
    p.add_argument("--failures", default="none",
                   help=f"server failures and recoveries, of none, {', '.join(failure.RECOVERIES)} (%(default)s): "
                   "one more axis of the grid; the table gives each run's goodput")
    p.add_argument("--server-mtbf-h", type=float, default=failure.MTBF_H,
                   help="failures: mean hours between one server's failures (%(default).1f: Llama 3's rate)")
    p.add_argument("--repair-h", type=float, default=failure.REPAIR_H, help="failures: hours out (%(default)s)")
    p.add_argument("--swap-s", type=float, default=failure.SWAP_S,
                   help="swap: seconds from the failure to iterating again (%(default)s: the failover benchmark's "
                   "median)")
    p.add_argument("--restart-s", type=float, default=failure.RESTART_S,
                   help="checkpoint, scratch: seconds from placed again to iterating (%(default)s)")
    p.add_argument("--checkpoint-s", type=float, default=failure.CHECKPOINT_S,
                   help="failures: seconds of running between checkpoints (%(default)s)")
    p.add_argument("--oversubscriptions", metavar="LIST",
                   help="an axis of uplink oversubscriptions, e.g. 1,4,16 (replaces --oversubscription)")
    p.add_argument("--mixes", default="field",
                   help=f"an axis of job-size mixes, of {', '.join(MIXES)} (%(default)s; "
                   "simulator/studies/sweep.py MIXES)")
    p.add_argument("--loads", default="0.5,0.7,0.9", help="offered loads (%(default)s)")
    p.add_argument("--seed", type=int, default=1, help="first seed (%(default)s)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per cell: --seed ... --seed+N-1 (%(default)s)")
    p.add_argument("--defrag-interval", type=float, default=300.0, help="defrag: seconds between rounds (%(default)s)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="a running Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: start a local cluster)")
    p.add_argument("--workers", type=int, default=2, help="local cluster: worker processes (%(default)s)")
    p.add_argument("--threads", type=int, default=1, help="local cluster: threads per worker (%(default)s)")
    p.add_argument("--out", type=Path, required=True, help="folder for study.*, runs.csv, plots")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=main)


def main(args) -> int:
    t0 = time.monotonic()
    try:
        tasks = grid(args)
        if args.workers < 1 or args.threads < 1:
            raise ValueError("--workers and --threads must be at least 1")
        if args.out.exists() and not args.out.is_dir():
            raise ValueError(f"--out {args.out} is a file, not a folder")
    except Exception as e:  # noqa: BLE001 - every bad setting is reported the same way
        print(f"optirack sweep: error: {e}", file=sys.stderr)
        return 2

    def progress(done: int, total: int) -> None:
        if not args.quiet:
            print(f"\rsweep: {done}/{total} runs, {time.monotonic() - t0:.0f} s", end="", file=sys.stderr)

    try:
        rows = run_grid(tasks, args.scheduler, args.workers, args.threads, progress=progress)
    except OSError as e:
        print(f"\noptirack sweep: error: cannot reach the Dask scheduler {args.scheduler}: {e}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(file=sys.stderr)
    table = study(rows)
    where = args.scheduler or f"a local Dask cluster of {args.workers} worker(s) x {args.threads} thread(s)"
    meta = {
        "command": "optirack sweep " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["sweep"] else "optirack sweep",
        "tasks": len(tasks),
        "description": f"{args.gpus} GPUs ({args.gpus_per_switch} per switch, oversubscription "
                       f"{args.oversubscriptions or format(args.oversubscription, 'g')}, models {args.models}), "
                       f"{args.jobs} synthetic jobs per run (job sizes: {args.mixes}); "
                       f"policies {args.policies}; schedulers {args.schedulers}; failures {args.failures}"
                       + (f" (a server fails every {args.server_mtbf_h:g} h)" if args.failures != "none" else "")
                       + f"; loads {args.loads}; seeds "
                       f"{args.seed}-{args.seed + args.seeds - 1}; on {where}",
        "wall_s": round(time.monotonic() - t0, 1),
    }
    files = write(args.out, rows, table, meta, not args.no_plots)
    print(markdown(table, meta))
    print(f"wrote {', '.join(str(f) for f in files)} in {time.monotonic() - t0:.1f} s")
    return 0
