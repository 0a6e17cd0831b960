"""`optirack simulate`: the controller's placement over a simulated cluster (docs/simulator.md).

Rack files and traces are found by name from any directory (controller/bundled.py): in the checkout, or in the copy
a `pip install` puts under <prefix>/share/optirack/. `--case` runs the demo's validated settings: the newest committed
record of the rack's fabric (its calibration and its fabric's sharing) and the demo's iterations (that record's).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from controller import bundled
from controller.core import admission
from controller.core.rack import RackError
from profiles import WORKLOADS, compute_seconds
from simulator import (
    calibration,
    engine,
    failures,
    lingjun,
    models,
    neighbours,
    racks,
    records,
    report,
    traces,
    workloads,
)
from simulator.interference import Limits
from simulator.network import GBPS, SHARINGS
from simulator.study import run_all
from simulator.workloads import DURATION_MODES

PAPER_RACK = "topologies/paper-testbed.yaml"
EXAMPLES = (  # the --help's examples, each as it runs from any directory (tests/unit/test_sim_help.py runs the first)
    f"optirack simulate --rack {PAPER_RACK} --case a --out sim-a",
    "optirack simulate --gpus 4096 --jobs 2000 --seed 7 --out sim-4096",
    "optirack simulate --gpus 32 --gpus-per-switch 8 --gpus-per-server 4 --oversubscription 8 --spare 1 --models V100 "
    "--trace traces/sample.csv --out sim-trace",
)


def newest_record(fabric: str) -> Path | None:
    """The newest committed whole `make demo` record (both cases, repeated) made on `fabric`: what --case compares
    with and calibrates from by default."""
    directory = bundled.directory(bundled.RECORDS)
    installed = directory.is_relative_to(bundled.SHARE)  # pip's copy: no git to ask which are committed
    found = [r for r in records.load(directory, tracked_only=not installed)
             if r.full and (r.data.get("fabric") or "droptail") == fabric]
    return found[-1].path if found else None


def _calibration(args, rack) -> tuple[Path | None, dict | None]:
    """The record --net emulation calibrates from, and --case compares with: --calibration's (an error where it
    cannot be read), else the newest of the rack's fabric."""
    if args.calibration is not None:
        path = bundled.find(args.calibration, bundled.RECORDS, ".json")
        if not path.is_file():
            raise ValueError(f"--calibration {args.calibration}: no such record (make demo writes them under "
                             f"{bundled.RECORDS}/)")
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"--calibration {args.calibration}: cannot read the record: {e}") from None
        if not isinstance(record, dict) or "points" not in record and "runs" not in record:
            raise ValueError(f"--calibration {args.calibration}: not a make demo record")
        return path, record
    path = newest_record(rack.spec.emulation.fabric)
    return path, (calibration.load_record(path) if path else None)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate", help="simulate a cluster under the controller's placement policies",
        description="Simulate training jobs on a rack (a rack file or a generated one) under each placement policy, "
                    "with the controller's own placement code, and write a table, JSON and plots to --out.",
        epilog="Examples: " + ";  ".join(EXAMPLES) + ". Rack files and traces are found by name from any "
               "directory: --rack paper-testbed, --trace sample.csv.")
    rack = p.add_argument_group("rack (one of)")
    rack.add_argument("--rack", help="a rack file, or a bundled one by name, e.g. paper-testbed (default with --case: "
                      f"{PAPER_RACK})")
    rack.add_argument("--gpus", type=int, help="generate a rack of this many GPUs")
    rack.add_argument(
        "--gpus-per-switch", type=int, default=32, help="generated: GPUs per aggregator switch (%(default)s)"
    )
    rack.add_argument("--gpus-per-server", type=int, default=8, help="generated: GPUs per server (%(default)s)")
    rack.add_argument(
        "--oversubscription",
        type=float,
        default=16.0,
        help="generated: a switch's GPUs' NIC capacity over its uplink's (%(default)s: 32 x 100 Gbit/s "
        "over 200 Gbit/s)",
    )
    rack.add_argument(
        "--spare",
        type=float,
        default=2.0,
        help="generated: a switch's OCS downlinks over its share of the GPUs, the room regrouping "
        "moves GPUs into (%(default)s)",
    )
    rack.add_argument(
        "--models",
        default="V100:0.5,A100:0.5",
        help="generated: GPU models and their shares of the servers (%(default)s)",
    )
    rack.add_argument(
        "--ocs-ports",
        type=int,
        default=0,
        help="generated: at most this many ports per OCS (default: 1024, or up to 9999 when every switch's "
        "ports on every OCS need more)",
    )
    rack.add_argument("--nic-gbps", type=float, default=100.0, help="generated: NIC line rate (%(default)s)")
    work = p.add_argument_group("workload (one of)")
    work.add_argument("--case", choices=["a", "b"], help="the paper's case, as make demo runs it")
    work.add_argument(
        "--trace",
        help="a trace file: CSV (arrival_s,gpus,model and iterations or duration_s; optional gpu_type), or a "
        "public trace (see --trace-format); a bundled one by name, e.g. sample.csv",
    )
    work.add_argument(
        "--trace-format",
        choices=["auto", *traces.FORMATS, traces.LINGJUN],
        default="auto",
        help="philly: msr-fiddle/philly-traces' cluster_job_log (JSON); helios: HeliosData's or Acme's "
        "cluster_log.csv; pai: Alibaba PAI 2020's pai_task_table.csv (pai_job_table.csv beside it gives "
        "submit times); sacct: Slurm's sacct --parsable2 with JobID,Submit,Start,End,AllocTRES; "
        "auto: by the file's name and first line (%(default)s)",
    )
    work.add_argument(
        "--trace-model",
        default="resnet50",
        help="the workload every job of a public trace runs, which names none: vgg16, resnet50 or "
        "transformer:<parameters>, e.g. transformer:7e9 (%(default)s)",
    )
    work.add_argument(
        "--durations",
        choices=list(DURATION_MODES),
        default="derived",
        help="jobs given by duration: derived: iterations from the workload, so that alone on the fabric a job "
        "keeps its recorded duration; replayed: held for the recorded duration as is, off the network (%(default)s)",
    )
    work.add_argument(
        "--strict",
        action="store_true",
        help="refuse a trace with a job larger than the rack (default: skip such jobs and count them)",
    )
    work.add_argument("--jobs", type=int, help="this many synthetic jobs (see --seed, --load)")
    work.add_argument("--seed", type=int, default=1, help="synthetic jobs: random seed (%(default)s)")
    work.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="synthetic jobs: run this many seeds (--seed, --seed+1, ...) and give means with 95 %% intervals "
        "(%(default)s)",
    )
    work.add_argument(
        "--load",
        type=float,
        default=0.9,
        help="synthetic jobs: offered load, in GPU-seconds over the cluster's (%(default)s)",
    )
    work.add_argument(
        "--iterations", type=int,
        help="--case: iterations of the job of concern (default: as the demo ran them, the compared record's)"
    )
    pol = p.add_argument_group("policies and models")
    pol.add_argument(
        "--policies",
        default="fixed,regroup,defrag,timeshift",
        help="which to compare (%(default)s); baselines: ideal (a non-blocking electrical fabric, the upper "
        "bound), static (the static oversubscribed electrical fabric: the cabling never changes, as fixed); the "
        "neighbours (docs/neighbour-*.md): oddl, panama, switchml, topoopt, sipml, mltcp",
    )
    pol.add_argument(
        "--schedulers",
        default="fifo",
        help="admission policies (controller/core/admission.py), each run with every placement policy: fifo (first "
        "come first served), backfill (EASY backfill), sjf (shortest job first), las (least attained service, "
        "preemptive, Tiresias-like); a run other than fifo is named policy+scheduler, e.g. regroup+backfill "
        "(%(default)s)",
    )
    fail = p.add_argument_group("server failures (simulator/failures.py)")
    fail.add_argument(
        "--failures",
        default="none",
        help="recoveries to compare, each run with every policy and scheduler: none (no failures), swap (spare GPUs "
        "swapped in through the OCS, restart from the last checkpoint), checkpoint (restart from the last "
        "checkpoint after the server's repair), scratch (restart from the first iteration); a run with failures is "
        "named policy+recovery, e.g. regroup+swap (%(default)s)",
    )
    fail.add_argument(
        "--server-mtbf-h",
        type=float,
        default=failures.MTBF_H,
        help="mean hours between one server's failures (%(default).1f: Llama 3's 419 interruptions in 54 days on "
        "2,048 servers of 8 GPUs)",
    )
    fail.add_argument("--repair-h", type=float, default=failures.REPAIR_H,
                      help="hours a failed server is out (%(default)s; assumed)")
    fail.add_argument("--swap-s", type=float, default=failures.SWAP_S,
                      help="swap: seconds from the failure to the job iterating again (%(default)s: issue #25's "
                      "measured median, results/bench/20261125T070230Z-ce2c15f-bench_failover.json)")
    fail.add_argument("--restart-s", type=float, default=failures.RESTART_S,
                      help="checkpoint, scratch: seconds from being placed again to iterating (%(default)s; assumed)")
    fail.add_argument("--checkpoint-s", type=float, default=failures.CHECKPOINT_S,
                      help="seconds of running between a job's checkpoints (%(default)s; assumed)")
    pol.add_argument(
        "--baseline",
        help="the policy the others are compared with, in percent (default: the first of --policies)",
    )
    pol.add_argument(
        "--defrag-interval", type=float, default=300.0, help="defrag: seconds between rounds (%(default)s)"
    )
    pol.add_argument(
        "--net",
        choices=["rack", "emulation"],
        help="rack: a real rack's protocol efficiency and step latency (assumed), max-min sharing; "
        "emulation: calibrated to this project's emulated rack from a demo record (--calibration), with the "
        "sharing of that record's fabric: max-min on the lossless fabric (the default), held on droptail "
        "(default: emulation with --case, rack otherwise)",
    )
    pol.add_argument(
        "--sharing",
        choices=list(SHARINGS),
        help="how rings placed on one link share it, overriding --net's: maxmin: the rings transferring "
        "at the moment share it max-min fairly and a computing ring's share goes to the others at "
        "once (a lossless fabric: RoCE with PFC, and the emulated lossless fabric; --net rack's, and --net "
        "emulation's on a lossless record); held: each ring keeps its equal share through its compute phases "
        "(the emulated droptail fabric's TCP over shallow drop-tail queues; --net emulation's on a droptail "
        "record). Time shifting only shifts under maxmin",
    )
    pol.add_argument(
        "--nvlink-gbps",
        type=float,
        default=0.0,
        help="a server's GPUs as an NVLink domain at this rate per GPU, e.g. 2400 (300 GB/s): flows inside a "
        "server skip the NICs, transformers' tensor parallelism runs over it (default 0: every flow through "
        "its NIC, as in the emulation)",
    )
    pol.add_argument("--efficiency", type=float,
                     help="override the protocol efficiency, a fraction of line rate in (0, 1], e.g. 0.9")
    pol.add_argument("--step-latency-us", type=float,
                     help="override the per-step latency (rack microseconds, 0 or more)")
    pol.add_argument(
        "--calibration",
        help="--net emulation: the make demo record to calibrate from and, with --case, compare with (a file, or a "
        "record's name under results/records/; default: the newest committed whole record of the rack's fabric)",
    )
    pol.add_argument(
        "--step-model",
        choices=["auto", "exact", "phase"],
        default="auto",
        help="exact: every ring step an event; phase: whole all-reduces (auto: exact up to 64 GPUs)",
    )
    pol.add_argument(
        "--interference",
        choices=["auto", "detail", "mean"],
        default="auto",
        help="rings that share links: stepped through (detail) or the mean-field model (auto: by size)",
    )
    pol.add_argument(
        "--control-overhead-ms",
        type=float,
        default=10.0,
        help="controller time per reconfiguration besides switching (%(default)s; make bench measures it)",
    )
    neighbours.add_arguments(p)
    out = p.add_argument_group("output")
    out.add_argument(
        "--out", type=Path, required=True, help="folder for summary.md, results.json, jobs.csv (see --detail) and plots"
    )
    out.add_argument(
        "--detail",
        action="store_true",
        help=f"runs of more than {report.DETAIL_LIMIT:,} jobs: also write every job's row, gzipped (jobs.csv.gz); "
        "smaller runs always keep them (jobs.csv, results.json)",
    )
    out.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    out.add_argument(
        "--workers",
        type=int,
        default=0,
        help="processes to run the policies in (default: one per core, at most one per policy)",
    )
    p.set_defaults(func=main)


# Each number flag of the failure model with its unit and the values it takes: refused in the unit it is given in
# (simulator.failures.Failures.check would name the seconds it converts the hours to).
FAILURE_FLAGS = (("server_mtbf_h", "hours", False), ("repair_h", "hours", True), ("swap_s", "seconds", True),
                 ("restart_s", "seconds", True), ("checkpoint_s", "seconds", False))


def check_failure_flags(args) -> None:
    """A ValueError naming the flag, its unit and what it must be, for a failure setting out of range."""
    for name, unit, zero in FAILURE_FLAGS:
        value = getattr(args, name)
        if not (0 <= value if zero else 0 < value) or value == float("inf") or value != value:
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} is in {unit} and must be {'0 or more' if zero else 'positive'}, not {value:g}")


def _rack(args):
    if args.rack and args.gpus:
        raise ValueError("give --rack or --gpus, not both")
    if args.trace and not args.rack and args.gpus is None and (args.trace_format == "lingjun" or (
            args.trace_format == "auto" and traces.detect(Path(args.trace)) == "lingjun")):  # its rack: its topo.csv
        return lingjun.rack(args.trace, args.nic_gbps, args.oversubscription)
    if args.gpus is not None:
        if args.ocs_ports < 0 or args.ocs_ports == 1:
            raise ValueError(f"--ocs-ports must be at least 2, not {args.ocs_ports}")
        if not args.spare >= 1:
            raise ValueError("--spare must be at least 1 (every GPU needs a downlink)")
        return racks.generate(
            racks.RackOptions(
                args.gpus,
                args.gpus_per_switch,
                args.gpus_per_server,
                args.oversubscription,
                args.nic_gbps,
                racks.parse_models(args.models),
                spare=args.spare,
                ocs_ports=args.ocs_ports,
            )
        )
    if args.rack:
        return racks.load(str(bundled.rack(args.rack)))
    if not args.case:
        raise ValueError("give a rack: --rack FILE, or --gpus N for a generated one")
    return racks.load(str(bundled.rack(PAPER_RACK)))


def _typical_iteration(rack, model: str) -> float:
    """A job's iteration alone under one switch, on the rack's commonest GPU, 8 GPUs: for the offered load."""
    models = [g.model for g in rack.gpus.values()]
    common = max(sorted(set(models)), key=models.count)  # ties to the first by name: the same every run
    nic = min(g.nic.rate_gbps for g in rack.gpus.values()) * GBPS
    return compute_seconds(model, common) + 2 * 7 / 8 * WORKLOADS[model].gradient_bytes / nic


def _workload(args, rack, demo: dict | None = None):
    given = [x for x in (args.case, args.trace, args.jobs) if x is not None]
    if len(given) != 1:
        raise ValueError("give one workload: --case a|b, --trace FILE or --jobs N")
    if args.iterations is not None and not args.case:
        raise ValueError("--iterations is for --case (a trace's jobs and synthetic jobs carry their own)")
    if args.case:
        if args.iterations is None:  # as the demo runs the case: its record's iterations (12 in every record)
            args.iterations = int(((demo or {}).get("settings") or {}).get("iterations") or 12)
        if not 1 <= args.iterations <= workloads.MAX_ITERATIONS:
            raise ValueError(
                f"--iterations must be between 1 and {workloads.MAX_ITERATIONS:,}, not {args.iterations:,}"
            )
        jobs = workloads.paper_case(args.case, args.iterations)
        missing = sorted({g for j in jobs for g in j.names} - set(rack.gpus))
        if missing:
            raise ValueError(
                f"--case {args.case} names GPUs {', '.join(missing)}, which rack {rack.name} lacks "
                "(use the paper's rack: topologies/paper-testbed.yaml)"
            )
        return jobs, {
            "kind": "case",
            "case": args.case,
            "jobs": len(jobs),
            "description": f"the paper's case ({args.case}): {jobs[0].gpus} + {jobs[1].gpus} GPUs, both at once, "
            f"{args.iterations} iterations of the job of concern",
        }
    if args.trace:
        try:
            models.check(args.trace_model)
        except ValueError as e:
            raise ValueError(f"--trace-model: {e}") from None
        imported = traces.load(bundled.trace(args.trace), args.trace_format, args.trace_model)
        fitted = workloads.fit(imported.jobs, len(rack.gpus), {g.model for g in rack.gpus.values()}, args.strict)
        jobs = fitted.jobs
        left = dict(imported.left_out)
        if fitted.skipped:
            left[f"larger than the rack's {len(rack.gpus)} GPUs"] = len(fitted.skipped)
        by_duration = sum(1 for j in jobs if j.duration_s and not j.iterations)
        desc = f"trace {args.trace} ({imported.fmt}), {len(jobs)} jobs"
        if left:
            desc += "; left out: " + ", ".join(f"{n} {why}" for why, n in left.items())
        if by_duration:
            desc += f"; {by_duration} jobs by duration: {DURATION_MODES[args.durations]}"
        if fitted.types_dropped:
            desc += f"; {fitted.types_dropped} jobs asked for a GPU type the rack lacks and take any GPU"
        return jobs, {
            "kind": "trace",
            "trace": args.trace,
            "format": imported.fmt,
            "jobs": len(jobs),
            "left_out": left,
            "skipped": fitted.skipped[:20],
            "by_duration": by_duration,
            "durations": args.durations if by_duration else None,
            "gpu_types_dropped": fitted.types_dropped,
            "description": desc,
        }
    per = {m: _typical_iteration(rack, m) for m in WORKLOADS}
    jobs = workloads.synthetic(args.jobs, args.seed, len(rack.gpus), per, args.load)
    return jobs, {
        "kind": "synthetic",
        "jobs": args.jobs,
        "seed": args.seed,
        "load": args.load,
        "description": f"{args.jobs} synthetic jobs, seed {args.seed}, offered load {args.load:g}",
    }


def _net(args, rack, demo: dict | None = None, demo_path: Path | None = None):
    mode = args.net or ("emulation" if args.case else "rack")
    if args.efficiency is not None and not 0 < args.efficiency <= 1:
        raise ValueError(f"--efficiency is a fraction of the line rate in (0, 1], e.g. 0.9, not {args.efficiency:g}")
    if args.step_latency_us is not None and not 0 <= args.step_latency_us < float("inf"):
        raise ValueError(f"--step-latency-us is in rack microseconds, 0 or more, not {args.step_latency_us:g}")
    if mode == "emulation":
        if demo is None:
            raise ValueError(f"--net emulation needs a make demo record of the {rack.spec.emulation.fabric} fabric "
                             f"under {bundled.RECORDS}/ (none found), or --calibration FILE")
        cal = calibration.from_record(demo)
        net, source = cal.net(rack), f"{cal.source}; record {demo_path.stem if demo_path else '?'}"
    else:
        net, source = calibration.RACK, "assumed for a real rack"
    if args.efficiency is not None or args.step_latency_us is not None:
        net = replace(
            net,
            efficiency=args.efficiency if args.efficiency is not None else net.efficiency,
            step_latency_s=args.step_latency_us / 1e6 if args.step_latency_us is not None else net.step_latency_s,
        )
        source = "given on the command line"
    sharing = net.sharing if args.sharing is None else args.sharing
    net = replace(net, sharing=sharing)
    how = SHARINGS[sharing] + (" (--sharing)" if args.sharing is not None else "")
    desc = (
        f"{mode} model, efficiency {100 * net.efficiency:.1f} % of line rate, {1e6 * net.step_latency_s:,.0f} µs per "
        f"ring step ({source}), {how}"
    )
    return net, {
        "model": mode,
        "efficiency": net.efficiency,
        "step_latency_s": net.step_latency_s,
        "source": source,
        "sharing": sharing,
        "description": desc,
    }


def _checked_by(demo: dict, path: Path | None) -> str:
    """What checks the simulator against this record (tests/unit/test_sim_fidelity.py), in a few words."""
    from simulator import fidelity, modelhash

    if path is not None and path.name == records.DROPTAIL.name:
        return (f"the record the held sharing was chosen on; the fidelity test checks each point within "
                f"{100 * fidelity.TOLERANCE:g} %, not out of sample")
    if demo.get("model_hash") == modelhash.model_hash():
        return (f"made with the simulator's current model; the fidelity test checks each point within "
                f"{100 * fidelity.RECORD_TOLERANCE:g} %")
    return "made with an earlier model of the simulator: no test checks the current model against it"


def _against_emulation(args, record: dict, demo: dict | None, demo_path: Path | None) -> str:
    """The job of concern per policy, and the demo's emulated figures beside the simulated ones when recorded."""
    from simulator import fidelity

    lines = ["| policy | job of concern: switches | mean iteration | completion |", "| --- | --- | --- | --- |"]
    for name, p in record["policies"].items():
        job = p["jobs"][0]
        lines.append(f"| {name} | {job['switches']} | {job['mean_iteration_s']:.3f} s | {job['jct_s']:.1f} s |")
    if demo is None:
        lines += ["", "(no make demo record to compare with: run `make demo`.)"]
    else:
        rows, cal = fidelity.compare(demo, args.case, args.sharing)  # --sharing: a what-if against the emulation
        record["fidelity"] = [vars(r) | {"error": r.error} for r in rows]
        record["fidelity_record"] = demo_path.stem if demo_path else None
        lines += ["", f"Record `{demo_path.stem if demo_path else '?'}` ({demo.get('fabric') or 'droptail'} "
                  f"fabric): {_checked_by(demo, demo_path)}.", fidelity.table(rows, cal)]
    return "\n".join(lines)


def _over_seeds(args, rack, chosen, options, first: dict) -> dict:
    """The study again for --seed+1 ... --seed+N-1: per policy, each figure's mean and 95 % interval."""
    from simulator import metrics

    seeds = list(range(args.seed, args.seed + args.seeds))
    records = [first]
    per = {m: _typical_iteration(rack, m) for m in WORKLOADS}
    for seed in seeds[1:]:
        jobs = workloads.synthetic(args.jobs, seed, len(rack.gpus), per, args.load)
        study = run_all(rack, jobs, chosen, options, quiet=args.quiet, workers=args.workers or None)
        records.append(report.build(study, {}, args.baseline))
    base = first["baseline"]
    out = {"n": len(seeds), "seeds": seeds, "baseline": base, "policies": {}}
    for name in first["policies"]:
        sums = [r["policies"][name]["summary"] for r in records]
        out["policies"][name] = {
            "jct_mean": metrics.interval([s["jct_s"]["mean"] for s in sums]),
            "jct_p95": metrics.interval([s["jct_s"]["p95"] for s in sums]),
            "slowdown_mean": metrics.interval([s["slowdown"]["mean"] for s in sums]),
            "steady_computing": metrics.interval([s["steady"]["computing"] for s in sums]),
            "jct_mean_vs_baseline": metrics.interval(
                [r["policies"][name]["against_baseline"]["jct_s.mean"] for r in records]),
        }
    return out


def main(args) -> int:
    t0 = time.monotonic()
    try:
        rack = _rack(args)
        uses_record = args.case or args.net == "emulation" or args.calibration is not None
        demo_path, demo = _calibration(args, rack) if uses_record else (None, None)
        jobs, wmeta = _workload(args, rack, demo)
        net, nmeta = _net(args, rack, demo, demo_path)
        table = engine.policies(args.defrag_interval)
        names = [n.strip() for n in args.policies.split(",") if n.strip()]
        table.update(neighbours.policies(neighbours.from_args(args)))  # the neighbours' (simulator/neighbours.py)
        if wmeta.get("format") == "lingjun":  # recorded run times as iterations where each job ran
            jobs = lingjun.with_iterations(jobs, rack, net, args.nvlink_gbps)
            kept = [part for part in wmeta["description"].split("; ") if " jobs by duration: " not in part]
            wmeta["description"] = "; ".join(kept) + "; run times as iterations alone on the recorded GPUs (fixed " \
                "replays them)"
        unknown = [n for n in names if n not in table]
        if unknown or not names:
            raise ValueError(f"--policies: unknown {', '.join(unknown) or '(none given)'} (known: {', '.join(table)})")
        scheds = [n.strip() for n in args.schedulers.split(",") if n.strip()]
        bad = [n for n in scheds if n not in admission.POLICIES]
        if bad or not scheds:
            raise ValueError(
                f"--schedulers: unknown {', '.join(bad) or '(none given)'} (known: {', '.join(admission.POLICIES)})")
        recoveries = [n.strip() for n in args.failures.split(",") if n.strip()]
        bad = [n for n in recoveries if n != "none" and n not in failures.RECOVERIES]
        if bad or not recoveries:
            raise ValueError(f"--failures: unknown {', '.join(bad) or '(none given)'} "
                             f"(known: none, {', '.join(failures.RECOVERIES)})")
        check_failure_flags(args)
        fails = failures.Failures(
            "swap", args.server_mtbf_h * 3600, args.repair_h * 3600, args.swap_s, args.restart_s, args.checkpoint_s,
            args.seed)
        fails.check()
        if recoveries != ["none"] and (args.case or args.durations == "replayed"):
            raise ValueError("--failures: not modelled with --case or --durations replayed (jobs off the network)")
        chosen = [engine.with_recovery(engine.with_scheduler(table[n], s), f)
                  for n in names for s in scheds for f in recoveries]
        runs = [c.name for c in chosen]
        if args.baseline is not None and args.baseline not in runs:
            raise ValueError(f"--baseline {args.baseline} is not one of the runs ({', '.join(runs)})")
        if args.seeds < 1 or (args.seeds > 1 and args.jobs is None):
            raise ValueError("--seeds must be at least 1, and more than 1 only with --jobs (synthetic jobs)")
        if not 0 <= args.nvlink_gbps < float("inf"):
            raise ValueError(f"--nvlink-gbps must be 0 (none) or a positive rate, not {args.nvlink_gbps:g}")
        if not 0 < args.defrag_interval < float("inf"):
            raise ValueError("--defrag-interval must be positive")
        if args.out.exists() and not args.out.is_dir():
            raise ValueError(f"--out {args.out} is a file, not a folder")
    except (ValueError, RackError, workloads.TraceError, OSError, RuntimeError) as e:
        print(f"optirack simulate: error: {e}", file=sys.stderr)
        return 2
    if wmeta.get("left_out"):  # said on the console too, not only in summary.md
        left = ", ".join(f"{why}: {n}" for why, n in wmeta["left_out"].items())
        first = f" (first: {wmeta['skipped'][0]})" if wmeta.get("skipped") else ""
        print(f"optirack simulate: {args.trace}: jobs left out, {left}{first}; --strict refuses such a trace instead",
              file=sys.stderr)
    options = engine.Options(
        net,
        Limits(),
        args.control_overhead_ms / 1000,
        None if args.interference == "auto" else args.interference,
        args.step_model,
        args.nvlink_gbps,
        args.durations,
        fails if recoveries != ["none"] else None,
    )
    study = run_all(rack, jobs, chosen, options, quiet=args.quiet, workers=args.workers or None)
    meta = {
        "command": "optirack simulate " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if sys.argv[1:2] == ["simulate"]
        else "optirack simulate",
        "rack": {
            "name": rack.name,
            "source": rack.source,
            "gpus": len(rack.gpus),
            "summary": rack.summary().splitlines()[0],
        },
        "workload": wmeta,
        "net": nmeta,
        "options": {
            "policies": names,
            "schedulers": scheds,
            "failures": None if recoveries == ["none"] else {"recoveries": recoveries, **vars(fails),
                                                             "description": fails.describe()},
            "defrag_interval_s": args.defrag_interval,
            "step_model": args.step_model,
            "interference": args.interference,
            "control_overhead_ms": args.control_overhead_ms,
            "baseline": args.baseline,
            "nvlink_gbps": args.nvlink_gbps,
            "seeds": args.seeds,
            "neighbours": vars(neighbours.from_args(args)),
        },
    }
    record = report.build(study, meta, args.baseline)
    if args.seeds > 1:
        record["seeds"] = _over_seeds(args, rack, chosen, options, record)
    extra = ""
    if args.case:
        extra = _against_emulation(args, record, demo, demo_path)
    files = report.write(args.out, record, extra, study, args.detail)
    if not args.no_plots:
        from simulator import plots

        files += plots.write(args.out, record)
    print(report.table(record))
    if extra:
        print("\n" + extra)
    print("\n" + report.field_table(record))
    if record["options"]["failures"]:
        print("\n" + report.failure_table(record))
    if record.get("equal"):
        print("\n" + report.equal_text(record))
    if record.get("seeds"):
        print("\n" + report.seeds_table(record["seeds"]))
    if "timeshift" in record:
        print("\n" + report.timeshift_text(record["timeshift"]))
    if "mltcp" in record:
        print("\n" + neighbours.mltcp_text(record["mltcp"]))
    print(f"\nwrote {', '.join(str(f) for f in files)} in {time.monotonic() - t0:.1f} s")
    return 0


def standalone(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="optirack")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)
