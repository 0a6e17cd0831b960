"""`optirack simulate`: the controller's placement over a simulated cluster (docs/simulator.md).

Rack files and traces are found by name from any directory (controller/bundled.py): in the checkout, or in the copy
a `pip install` puts under <prefix>/share/optirack/. `--case` runs the demo's validated settings: the newest committed
record of the rack's fabric (its calibration and its fabric's sharing) and the demo's iterations (that record's).
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from controller import bundled
from controller.core import admission
from controller.core.rack import RackError
from profiles import WORKLOADS, compute_seconds
from simulator.cli import case_record, report
from simulator.cli import flags as simulate_flags
from simulator.cli.flags import PAPER_RACK
from simulator.inputs import lingjun, racks, traces, workloads
from simulator.inputs.workloads import DURATION_MODES
from simulator.model import calibration, engine, failures, models, neighbours
from simulator.model.interference import Limits
from simulator.model.network import GBPS, SHARINGS
from simulator.studies.study import run_all


def add_parser(sub) -> None:
    """`optirack simulate`'s subcommand: its flags (simulator/cli/flags.py) and this module's main."""
    simulate_flags.build(sub).set_defaults(func=main)


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


def _over_seeds(args, rack, chosen, options, first: dict) -> dict:
    """The study again for --seed+1 ... --seed+N-1: per policy, each figure's mean and 95 % interval."""
    from simulator.studies import metrics

    seeds = list(range(args.seed, args.seed + args.seeds))
    records = [first]
    per = {m: _typical_iteration(rack, m) for m in WORKLOADS}
    for seed in seeds[1:]:
        jobs = workloads.synthetic(args.jobs, seed, len(rack.gpus), per, args.load)
        study = run_all(rack, jobs, chosen, options, quiet=args.quiet, workers=args.workers or None,
                        figures=report.run_figures)
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
        demo_path, demo = case_record.calibration_of(args, rack) if uses_record else (None, None)
        jobs, wmeta = _workload(args, rack, demo)
        net, nmeta = _net(args, rack, demo, demo_path)
        table = engine.policies(args.defrag_interval)
        names = [n.strip() for n in args.policies.split(",") if n.strip()]
        table.update(neighbours.policies(neighbours.from_args(args)))  # the neighbours' (simulator/model/neighbours.py)
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
        simulate_flags.check_failure_flags(args)
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
        if not 0 <= args.control_overhead_ms < float("inf"):
            raise ValueError(f"--control-overhead-ms must be 0 or more, not {args.control_overhead_ms:g}")
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
    study = run_all(rack, jobs, chosen, options, quiet=args.quiet, workers=args.workers or None,
                    figures=report.run_figures)
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
        extra = case_record.against_emulation(args, record, demo, demo_path)
    files = report.write(args.out, record, extra, study, args.detail)
    if not args.no_plots:
        from simulator.cli import plots

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
