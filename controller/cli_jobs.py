"""`optirack` commands for jobs: submit, list, show, follow, stop, regroup and defragment, logs, prune."""

from __future__ import annotations

import argparse
import sys
import time

from controller.cli_common import _client, _print

# the controller's queue disciplines, as `optirack jobs` shows them
QUEUES = {"fifo": "fifo (first in, first out)", "backfill": "backfill (EASY backfilling, by estimate_s)",
          "sjf": "sjf (shortest estimated job first)"}


def _job_line(j: dict) -> str:
    done = f"{j['iterations_done']}/{j['iterations_total']}"
    mean = "-" if j["mean_iteration_s"] is None else f"{j['mean_iteration_s']:.3f}s"
    took = "" if j["completion_s"] is None else f" completed in {j['completion_s']:.1f}s"
    reason = f"  ({j['reason']})" if j.get("reason") else ""
    state = f"queued #{j['position']}" if j["state"] == "queued" else j["state"]
    gpus = ",".join(j["gpus"]) or f"({j['request']['gpus']} GPUs)"
    ext = j["request"].get("external")
    if ext:  # Slurm runs its ranks: no iterations here; who it is and its circuit changes instead
        events = ",".join(str(e) for e in j["events"]) or "none"
        return (f"{j['id']:8s} {state:11s} {gpus:24s} {','.join(j['switches']) or '-':10s} "
                f"{ext['scheduler'].capitalize()} job {ext['job']} of {ext.get('user') or '?'}, "
                f"circuit events {events}{reason}")
    return (
        f"{j['id']:8s} {state:11s} {gpus:24s} {','.join(j['switches']) or '-':10s} "
        f"iter {done:>9s} mean {mean}{took}{_collective(j)}{reason}"
    )


def _collective(j: dict) -> str:
    """Where a job that asked for aggregation sums its gradients, or why it runs as a ring ('' for any other)."""
    a = j.get("aggregation")
    if not a:
        return "  [aggregate: asked]" if j["request"].get("collective") == "aggregate" else ""
    if a["collective"] == "aggregate":
        return f"  [aggregate at {a['switch']}'s aggregator {a['address']}]"
    return f"  [ring: {a['reason']}]"


def _jobs(args) -> int:
    params = {
        "limit": args.limit,
        **({"state": args.state} if args.state else {}),
        **({"before": args.before} if args.before else {}),
    }
    data = _client(args).get("/jobs", **params)
    more = f"\n(older jobs: optirack jobs --before {data['older']})" if data.get("older") else ""
    queue = f"queue: {QUEUES.get(data['queue'], data['queue'])}\n" if data.get("queue") else ""
    _print(args, data, queue + ("\n".join(_job_line(j) for j in data["jobs"]) or "no jobs") + more)
    return 0


def _logs(args) -> int:
    data = _client(args).get(f"/jobs/{args.job}/logs", tail=args.tail)
    lines = [
        f"{data['job']} {data['state']}"
        + (f": {data['reason']}" if data["reason"] else "")
        + f" (lines {data['source']})"
    ]
    for gpu, out in data["logs"].items():
        lines += [f"--- {gpu}"] + [f"  {line}" for line in out]
    _print(args, data, "\n".join(lines))
    return 0


def _duration(text: str) -> float:
    """'90', '90s', '15m', '12h', '7d' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        return float(number) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration like 3600, 90m, 12h or 7d, not {text!r}") from None


def _prune(args) -> int:
    if args.older_than is None and args.keep is None:
        raise SystemExit("optirack prune: give --older-than, --keep, or both")
    body = {"older_than_s": args.older_than, "keep": args.keep, "events": args.events}
    data = _client(args).post("/jobs/prune", body)
    text = f"forgot {len(data['pruned'])} finished jobs" + (
        f" and {data['events_pruned']} events" if args.events else ""
    )
    _print(args, data, text)
    return 0


def _submit(args) -> int:
    gpus = int(args.gpus) if args.gpus.isdigit() else args.gpus.split(",")
    workload = {"mode": args.mode, "model": args.model, "iterations": args.iterations}
    if args.compute_seconds is not None:
        workload["compute_seconds"] = args.compute_seconds
    client = _client(args)
    body = {"gpus": gpus, "policy": args.policy, "workload": workload, "name": args.name, "queue": not args.no_queue,
            "collective": args.collective}
    if args.checkpoint_every is not None:
        body["checkpoint_every"] = args.checkpoint_every
    if args.estimate is not None:
        body["estimate_s"] = args.estimate
    if args.gpu_model:
        body["gpu_model"] = args.gpu_model
    job = client.post("/jobs", body)["job"]
    if job["note"] and not args.json:
        print(f"{job['id']}: {job['note']}", file=sys.stderr)
    if args.wait:
        while job["state"] in ("queued", "pending", "configuring", "running", "recovering"):
            time.sleep(1)
            job = client.get(f"/jobs/{job['id']}")["job"]
            print(f"\r{_job_line(job)}", end="", flush=True)
        print()
    _print(args, {"job": job}, _job_line(job))
    return 0 if job["state"] not in ("failed",) else 1


def _show(args) -> int:
    job = _client(args).get(f"/jobs/{args.job}")["job"]
    lines = [
        _job_line(job),
        f"  policy {job['request']['policy']}, workload {job['request']['workload']}",
        f"  circuits: {', '.join(f'{a}={b}' for a, b in job['circuits']) or '-'}",
        f"  reconfigurations: {', '.join(f'#{e}' for e in job['events']) or '-'}",
    ]
    if job["note"]:
        lines.append(f"  note: {job['note']}")
    _print(args, {"job": job}, "\n".join(lines))
    return 0


def _stop(args) -> int:
    job = _client(args).post(f"/jobs/{args.job}/stop")["job"]
    _print(args, {"job": job}, _job_line(job))
    return 0


def _plan_text(data: dict) -> str:
    """A defragmentation plan (or its result) for people."""
    lines = []
    for m in data["jobs_moved"]:
        lines.append(
            f"  {m['job']}: {'+'.join(m['switches_before'])} -> {'+'.join(m['switches_after'])}, "
            f"-{len(m['circuits_removed'])} +{len(m['circuits_added'])} circuits; iteration "
            f"{m['iteration_s_before']:.3f} s -> {m['iteration_s_after']:.3f} s (predicted), "
            f"{m['remaining_iterations']} to go: saves {m['predicted_saving_s']:.1f} s"
        )
    for u in data["jobs_untouched"]:
        lines.append(f"  {u['job']}: untouched, {u['reason']}")
    head = (
        f"{'plan' if not data['applied'] else 'applied'} (circuit map version {data['version']}): "
        f"{len(data['jobs_moved'])} job(s) moved, {data['circuits_changed']} circuits changed in one "
        f"reconfiguration, switches summed over jobs {data['switches_before']} -> {data['switches_after']}, "
        f"expected stall {1000 * data['expected_stall_s']:.0f} ms"
    )
    if data["applied"] and data["event"]:
        ev = data["event"]
        head += f"; event #{ev['id']}, dark {1000 * (ev['dark_window_s'] or 0):.1f} ms"
    elif not data["applied"] and data["jobs_moved"]:
        lines.append(f"apply exactly this plan: optirack regroup --version {data['version']}")
    return "\n".join([head, *lines]) if data["jobs_moved"] or data["jobs_untouched"] else "no running jobs"


def _regroup(args) -> int:
    client = _client(args)
    if args.job:
        if args.dry_run or args.version is not None:
            raise SystemExit("optirack: --dry-run and --version plan all running jobs; leave out the job id")
        data = client.post(f"/jobs/{args.job}/regroup")
        ev = data["event"]
        text = (
            f"{args.job} regrouped under {','.join(data['job']['switches'])}: "
            f"-{len(ev['removed'])} +{len(ev['added'])} "
            f"circuits, dark {1000 * ev['dark_window_s']:.1f} ms"
            if ev
            else f"{args.job}: {data['note']}"
        )
    else:
        body = {"version": args.version} if args.version is not None else None
        if args.dry_run:
            data = client.request("POST", "/regroup", body or {}, dry_run="true")
        else:
            data = client.request("POST", "/regroup", body or {})
        text = _plan_text(data)
    _print(args, data, text)
    return 0


def add_job_commands(sub) -> None:
    p = sub.add_parser("jobs", help="the controller's queue discipline, then its jobs, the newest last")
    p.add_argument("--state", help="only jobs in these states, e.g. running or done,failed")
    p.add_argument("--limit", type=int, default=100, help="how many (default %(default)s)")
    p.add_argument("--before", metavar="JOB", help="the page of jobs created before JOB")
    p.set_defaults(func=_jobs)
    p = sub.add_parser("logs", help="a job's last worker output lines (kept after the job ends)")
    p.add_argument("job")
    p.add_argument("--tail", type=int, default=50, help="lines per worker, at most 50 (default %(default)s)")
    p.set_defaults(func=_logs)
    p = sub.add_parser(
        "prune",
        help="forget old finished jobs",
        description="Forget finished jobs (done, failed, stopped): those that ended longer ago than "
        "--older-than, except the newest --keep. Running jobs are never touched.",
    )
    p.add_argument("--older-than", type=_duration, metavar="AGE", help="e.g. 3600, 90m, 12h, 7d")
    p.add_argument("--keep", type=int, metavar="N", help="keep the newest N finished jobs")
    p.add_argument("--events", action="store_true", help="also forget reconfiguration events older than --older-than")
    p.set_defaults(func=_prune)
    p = sub.add_parser("submit", help="start a training job")
    p.add_argument("--gpus", required=True, help="how many GPUs (e.g. 4), or which (e.g. gpu1,gpu2)")
    p.add_argument(
        "--policy",
        choices=["regroup", "fixed"],
        default="regroup",
        help="regroup: under one aggregator switch; fixed: keep the cabling (default %(default)s)",
    )
    p.add_argument(
        "--gpu-model",
        metavar="MODEL",
        help="only GPUs of this model (e.g. V100); default: any, one model when one has enough free",
    )
    p.add_argument(
        "--no-queue",
        action="store_true",
        help="fail (409) if it cannot be placed now, instead of waiting its turn in the queue",
    )
    p.add_argument(
        "--estimate",
        type=float,
        metavar="SECONDS",
        help="how long the job is expected to run (as Slurm's --time); required by a controller that queues by "
        "backfill or sjf",
    )
    p.add_argument(
        "--collective",
        choices=["ring", "aggregate"],
        default="ring",
        help="how the ranks sum their gradients: ring all-reduce, or at an in-network aggregator (placed under a "
        "switch whose aggregator has room; a ring, saying why, where none has) (default %(default)s)",
    )
    p.add_argument("--mode", choices=["profile", "real"], default="profile")
    p.add_argument("--model", default="vgg16", help="profile mode's workload (default %(default)s)")
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--compute-seconds", type=float, help="override the profile's compute time per iteration")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        metavar="K",
        help="iterations between checkpoints (default 20): a job that loses a server goes on from the last one",
    )
    p.add_argument("--name", default="")
    p.add_argument("--wait", action="store_true", help="follow the job (queued, then running) until it ends")
    p.set_defaults(func=_submit)
    p = sub.add_parser("show", help="one job in detail")
    p.add_argument("job")
    p.set_defaults(func=_show)
    p = sub.add_parser("stop", help="stop a job and clean up")
    p.add_argument("job")
    p.set_defaults(func=_stop)
    p = sub.add_parser(
        "regroup",
        help="regroup a running job, or defragment: all running jobs in one change",
        description="With a job id: bring that running job under fewer switches. Without: plan the "
        "joint move of every running job (fewest switches summed over jobs, then fewest "
        "circuits; a job that cannot gain is not touched) and apply it in one bulk OCS "
        "change, so each moved job stalls once. --dry-run shows the plan and changes "
        "nothing; --version N applies exactly the plan a dry run made from version N.",
    )
    p.add_argument("job", nargs="?", help="a job id; without it, every running job")
    p.add_argument("--dry-run", action="store_true", help="show the plan (moves, circuits, stall, predicted gain)")
    p.add_argument("--version", type=int, metavar="N", help="apply the dry-run plan made from circuit-map version N")
    p.set_defaults(func=_regroup)
