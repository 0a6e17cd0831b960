"""Where the emulation's lags (simulator/model/lags.py) come from: each measured from committed records.

`python -m evidence.tracefit` reads the trace replay record(s) (results/replay/, scripts/replay_trace.py) and the
`make demo` records with a detailed job log (results/records/: the first repeat of each case keeps `runs[i].job`,
its ranks' own iterations) and prints, in emulated seconds (the lags' unit) and rack seconds:
- admit: submit to start of the jobs placed at once (the replay's jobs with no other job's end between their
  submit, less RELEASE_WINDOW_S, and their start; the demo's detailed jobs);
- start: start to the first iteration (every rank's first iteration begins together: the ring's rendezvous);
  a least-squares line over the replay's jobs against the GPUs placed at the same instant up to and including the
  job (the engine's `burst`: jobs placed within GROUP_S of the one before), and the per-rank spread in the demo;
- end: the latest rank's last iteration to `ended_at` (the demo's detailed jobs);
- release: `ended_at` of the last job to end before a queued job's start to that start (the replay's jobs that
  waited);
- iteration: the 1-GPU jobs of the replay (no all-reduce): (end - first iteration - end lag) / iterations less the
  profile's compute, the cost of an iteration beyond it;
- what is left after the first iteration: each job's emulated time per iteration against the simulator's for the
  same GPUs alone on the rack (with and without the per-iteration lag), by job size and switches.
`--repeatability` instead sets the replay records against each other, job by job (the emulation's own spread: the
floor under the trace check's bounds).
A pure reading of the records: it predicts nothing (the model is simulator/model/, known by its fingerprint).
tests/unit/test_tracefit.py ties lags.py's constants to what this prints for the committed records.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the replays of the model before (b3b639874df2), made on this code's worker and controller: tuning data, all three
# policies pooled; the replays made after the lags' commit check them
REPLAYS = tuple(ROOT / "results" / "replay" / f"{s}.json" for s in ("20261126T212055Z-a3efd36",
                                                                       "20261126T220734Z-1e191d8"))
DEMO = tuple(ROOT / "results" / "records" / f"{s}.json" for s in (
    "20261126T154629Z-aafc90a", "20261126T155916Z-aafc90a", "20261126T161207Z-aafc90a"))
GROUP_S = 0.5  # rack s: the controller places the jobs of one queue drain within this of each other
RELEASE_WINDOW_S = 3.0  # rack s: a job ending this long before another's submit may still hold GPUs


def admit_replay(jobs: list[dict]) -> list[float]:
    """Submit to start (rack s) of the replay's jobs that no other job's end preceded (they found GPUs free)."""
    return [j["start_s"] - j["submit_s"] for j in jobs
            if not any(j["submit_s"] - RELEASE_WINDOW_S <= o["end_s"] <= j["start_s"] for o in jobs if o is not j)]


def release_rows(jobs: list[dict]) -> list[tuple[dict, float]]:
    """(job, from the last end before its start to its start, rack s) for the jobs some end preceded."""
    out = []
    for j in jobs:
        ends = [o["end_s"] for o in jobs
                if o is not j and j["submit_s"] - RELEASE_WINDOW_S <= o["end_s"] <= j["start_s"]]
        if ends:
            out.append((j, j["start_s"] - max(ends)))
    return out


def release(jobs: list[dict]) -> list[float]:
    return [x for _, x in release_rows(jobs)]


def bursts(jobs: list[dict]) -> list[int]:
    """Per job (the rows' order): the GPUs placed at its instant up to and including its own, as the engine counts
    them: jobs started within GROUP_S of the one started before them form one instant."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i]["start_s"])
    out = [0] * len(jobs)
    last, count = None, 0
    for i in order:
        s = jobs[i]["start_s"]
        count = (count if last is not None and s - last <= GROUP_S else 0) + jobs[i]["gpus_asked"]
        out[i], last = count, s
    return out


def drains(jobs: list[dict]) -> list[list[dict]]:
    """The replay's jobs in groups placed by one queue drain (started within GROUP_S of the one before), 2 or more."""
    out: list[list[dict]] = []
    for j in sorted(jobs, key=lambda j: j["start_s"]):
        if out and j["start_s"] - out[-1][-1]["start_s"] <= GROUP_S:
            out[-1].append(j)
        else:
            out.append([j])
    return [g for g in out if len(g) > 1]


def per_gpu_within(groups: list[list[dict]]) -> float:
    """The least-squares slope of started_at (rack s) on the job's GPUs within each group (a fixed effect each)."""
    x, y = [], []
    for g in groups:
        mg, ms = statistics.fmean(j["gpus_asked"] for j in g), statistics.fmean(j["start_s"] for j in g)
        x += [j["gpus_asked"] - mg for j in g]
        y += [j["start_s"] - ms for j in g]
    return line(x, y)[1]


def line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((v - mx) ** 2 for v in x)
    b = sum((u - mx) * (v - my) for u, v in zip(x, y, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


def plane(x1: list[float], x2: list[float], y: list[float]) -> tuple[float, float]:
    """Least squares y = b1 x1 + b2 x2 (through the origin)."""
    s11 = sum(u * u for u in x1)
    s22 = sum(v * v for v in x2)
    s12 = sum(u * v for u, v in zip(x1, x2, strict=True))
    s1y = sum(u * w for u, w in zip(x1, y, strict=True))
    s2y = sum(v * w for v, w in zip(x2, y, strict=True))
    det = s11 * s22 - s12 * s12
    return (s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det


def iterating_at(jobs: list[dict], key: str = "admit_s") -> list[float]:
    """Per job (the rows' order): the GPUs of the other jobs iterating (first iteration to end) at its `key` instant;
    at its admission, as the engine counts its running jobs' GPUs at a placement."""
    return [float(sum(o["gpus_asked"] for o in jobs
                      if o is not j and o["first_iteration_s"] <= j[key] < o["end_s"])) for j in jobs]


def demo_jobs(record: dict) -> list[dict]:
    """The demo's detailed jobs: (created to started, started to every rank's first iteration, latest last
    iteration to ended), emulated s."""
    out = []
    for run in record.get("runs", []):
        job = run.get("job")
        if not job or not job.get("ranks"):
            continue
        its = {g: [e for e in v if e.get("event") == "iteration"] for g, v in job["ranks"].items()}
        firsts = [min(e["t_start"] for e in v) for v in its.values() if v]
        lasts = [max(e["t_end"] for e in v) for v in its.values() if v]
        out.append({"tag": run["tag"], "admit": job["started_at"] - job["created_at"], "gpus": len(job["ranks"]),
                    "start": [f - job["started_at"] for f in firsts], "end": job["ended_at"] - max(lasts)})
    return out


def per_iteration(jobs: list[dict], rack_file: Path, lags_on: bool) -> list[dict]:
    """Each replayed job's emulated time per iteration after the first (end lag out) beside the simulator's for
    its GPUs alone on the rack (rack s)."""
    from controller.core.rack import load_rack
    from evidence import tracecheck
    from simulator.inputs.workloads import JobSpec
    from simulator.model import lags, models
    from simulator.model.engine import Options, Run, policies

    rack = load_rack(rack_file)
    d = rack.spec.emulation.time_dilation
    cal, _ = tracecheck.calibration_for(rack.spec.emulation.fabric)
    charged = lags.Lags(iteration_s=lags.ITERATION_S / d) if lags_on else lags.NONE
    opts = Options(net=cal.net(rack), step_model="exact", lags=charged)
    out = []
    for j in jobs:
        spec = JobSpec("x", 0.0, j["gpus_asked"], j["model"], j["iterations"], names=tuple(j["gpus"]), policy="fixed")
        sim = Run(rack, [spec], policies(300.0)["fixed"], opts).run().jobs[0].alone_iteration_s
        emu = (j["end_s"] - j["first_iteration_s"] - lags.END_S / d) / j["iterations"]
        compute = max(models.cost(j["model"], [rack.gpus[g].model for g in j["gpus"]], 4, 0.0, 1.0).compute_s)
        out.append({"index": j["index"], "gpus": j["gpus_asked"], "switches": len(j["switches"]),
                    "model": j["model"], "emulated_s": emu, "simulated_s": sim, "compute_s": compute})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evidence.tracefit", description=__doc__.splitlines()[0])
    ap.add_argument("--replay", type=Path, nargs="+", default=list(REPLAYS),
                    help="replay records (results/replay/), every policy of each pooled (default: the lags' own)")
    ap.add_argument("--demo", type=Path, nargs="*", default=list(DEMO))
    ap.add_argument("--repeatability", action="store_true",
                    help="instead: each pair of the --replay records against each other (the emulation's own spread)")
    args = ap.parse_args(argv)
    try:
        records = [json.loads(p.read_text()) for p in args.replay]
        demos = [json.loads(p.read_text()) for p in args.demo]
    except (OSError, ValueError) as e:
        print(f"tracefit: {e}", file=sys.stderr)
        return 2
    d = records[0]["time_dilation"]
    if any(r["time_dilation"] != d or r["rack_file"] != records[0]["rack_file"] for r in records):
        print("tracefit: the replay records differ in rack file or time dilation", file=sys.stderr)
        return 2
    if args.repeatability:
        if len(records) < 2:
            print("tracefit: --repeatability needs two or more --replay records", file=sys.stderr)
            return 2
        for i, (pa, ra) in enumerate(zip(args.replay, records, strict=True)):
            for pb, rb in zip(args.replay[i + 1:], records[i + 1:], strict=True):
                for policy, r in sorted(repeatability(ra, rb).items()):
                    print(f"{pa.stem} vs {pb.stem}, {policy}: completion time |difference| median "
                          f"{100 * r['median']:.1f} %, p90 {100 * r['p90']:.1f} % over {r['jobs']} jobs; makespan "
                          f"{r['makespan_a_s']:.1f} vs {r['makespan_b_s']:.1f} s "
                          f"({100 * (r['makespan_b_s'] / r['makespan_a_s'] - 1):+.1f} %)")
        from evidence import tracebars

        bound = tracebars.newest().literal["makespan_error"]

        for policy, m in makespans(records).items():
            window = "exists" if max(m) * (1 - bound) <= min(m) * (1 + bound) else "does not exist"
            print(f"{policy}: makespans {', '.join(f'{x:.1f}' for x in m)} s over {len(m)} replays; mean "
                  f"{statistics.fmean(m):.1f} s, the longest {100 * (max(m) / min(m) - 1):.1f} % over the shortest; "
                  f"a prediction within {100 * bound:g} % of every one {window}")
        return 0
    runs = replay_runs(records)
    dj = [x for r in demos for x in demo_jobs(r)]
    rack_file = ROOT / records[0]["rack_file"]
    fig = fit(runs, dj, d, rack_file)
    print(f"{', '.join(p.stem for p in args.replay)}: {len(runs)} policy runs, {sum(map(len, runs))} jobs, and "
          f"{len(dj)} detailed demo jobs; emulated s (rack s at dilation {d:g}):")
    for k, v in fig.items():
        print(f"  {k}: {_fmt(v, d) if isinstance(v, list) else f'{v:.3f} s'}")
    jobs = [j for run in runs for j in run]
    rows = per_iteration(jobs, rack_file, False)
    with_lag = per_iteration(jobs, rack_file, True)
    print("  after the first iteration, emulated per iteration / simulated alone (median; min-max):")
    for label, pick in (("1 GPU", lambda r: r["gpus"] == 1), ("one switch, 2+ GPUs",
                                                               lambda r: r["gpus"] > 1 and r["switches"] == 1),
                        ("2+ switches", lambda r: r["switches"] > 1),
                        ("resnet50, 2+ GPUs", lambda r: r["gpus"] > 1 and r["model"] == "resnet50"),
                        ("vgg16, 2+ GPUs", lambda r: r["gpus"] > 1 and r["model"] == "vgg16"),
                        ("all", lambda r: True)):
        for name, rs in (("without", rows), ("with", with_lag)):
            q = [r["emulated_s"] / r["simulated_s"] for r in rs if pick(r)]
            print(f"    {label}, {name} the per-iteration lag: {statistics.median(q):.3f} ({min(q):.3f}-"
                  f"{max(q):.3f}) over {len(q)} jobs")
    return 0


def repeatability(a: dict, b: dict) -> dict[str, dict[str, float]]:
    """Two replay records of one trace against each other, per policy both hold: the median and p90 of
    |completion time in b / in a - 1| over the jobs done in both, and each makespan (rack s): how far the emulation
    repeats itself, the floor under the trace check's bounds."""
    from evidence import tracecheck

    out = {}
    for policy in a["policies"].keys() & b["policies"].keys():
        ja = {j["index"]: j for j in a["policies"][policy]["jobs"] if j["state"] == "done"}
        jb = {j["index"]: j for j in b["policies"][policy]["jobs"] if j["state"] == "done"}
        both = sorted(ja.keys() & jb.keys())
        if not both:
            continue
        diff = [abs((jb[i]["end_s"] - jb[i]["submit_s"]) / (ja[i]["end_s"] - ja[i]["submit_s"]) - 1) for i in both]
        out[policy] = {"jobs": len(both), "median": statistics.median(diff), "p90": tracecheck.p90(diff),
                       "makespan_a_s": makespan(ja.values()), "makespan_b_s": makespan(jb.values())}
    return out


def makespan(jobs) -> float:
    """A policy run's makespan: the last end among its jobs that ended done (rack s)."""
    return max(j["end_s"] for j in jobs if j["state"] == "done")


def makespans(records: list[dict]) -> dict[str, list[float]]:
    """Per policy, each replay record's makespan in the records' order, for the policies every record holds."""
    common = set.intersection(*(set(r["policies"]) for r in records)) if records else set()
    return {p: [makespan(r["policies"][p]["jobs"]) for r in records] for p in sorted(common)}


def replay_runs(records: list[dict]) -> list[list[dict]]:
    """Every policy run of each replay record: its jobs that ended done."""
    return [[j for j in run["jobs"] if j["state"] == "done"] for r in records for run in r["policies"].values()]


def _fmt(values: list[float], d: float) -> str:
    return (f"{statistics.median(values):.3f} s ({statistics.median(values) / d:.3f} rack s; median, "
            f"{min(values):.3f}-{max(values):.3f}, {len(values)} values)")


def fit(runs: list[list[dict]], demo: list[dict], d: float, rack_file: Path) -> dict[str, list[float] | float]:
    """The lags' figures, emulated s: each a list of measured values (its median is the lag) or a fitted number.
    `runs`: replays' policy runs, each its jobs (rack s, dilation `d`), pooled (queue drains, bursts and releases
    are each run's own); `demo`: demo_jobs of the demo records."""
    from controller.core.rack import load_rack
    from simulator.model import models

    rack = load_rack(rack_file)
    per_gpu = d * per_gpu_within([g for jobs in runs for g in drains(jobs)])
    free = [(j, j["start_s"] - j["submit_s"]) for jobs in runs for j in jobs
            if j["start_s"] - j["submit_s"] in admit_replay(jobs)]
    at_once = [d * x - per_gpu * j["gpus_asked"] for j, x in free] + [x["admit"] - per_gpu * x["gpus"] for x in demo]
    containers = statistics.median(at_once)
    every = [j for jobs in runs for j in jobs]
    delays = [d * (j["first_iteration_s"] - j["start_s"]) for j in every]
    placed_now = [float(x) for jobs in runs for x in bursts(jobs)]
    a, b = line(placed_now, delays)
    per_placed, per_busy = plane(placed_now, [x for jobs in runs for x in iterating_at(jobs)], delays)
    busy = [x for jobs in runs for x in iterating_at(jobs, "start_s")]
    end = statistics.median(x["end"] for x in demo)
    iteration = [d * (j["end_s"] - j["first_iteration_s"]) / j["iterations"] - end / j["iterations"]
                 - d * models.cost(j["model"], [rack.gpus[j["gpus"][0]].model], 4, 0.0, 1.0).compute_s[0]
                 for j in every if j["gpus_asked"] == 1]
    waited = [(j, x) for jobs in runs for j, x in release_rows(jobs)]
    return {
        "submit to started_at, GPUs free (replay)": [d * x for _, x in free],
        "submit to started_at, GPUs free (demo)": [x["admit"] for x in demo],
        "containers per GPU (least squares within the replay's queue drains)": per_gpu,
        "containers (GPUs free; less the per-GPU part)": at_once,
        "start to first iteration (replay)": delays,
        "start: a, least squares on the GPUs placed at the instant": a,
        "start: b, per GPU placed at the instant": b,
        "start: per GPU iterating on the rack at its start (least squares slope)": line(busy, delays)[1],
        "start (the lags' model): per GPU placed at the instant, through the origin with the next": per_placed,
        "start (the lags' model): per GPU of other jobs iterating at its admission": per_busy,
        "start to every rank's first iteration (demo)": [statistics.median(x["start"]) for x in demo],
        "ranks' first iterations apart (demo), at most": max(max(x["start"]) - min(x["start"]) for x in demo),
        "end (demo)": [x["end"] for x in demo],
        "ended_at to the next start (replay)": [d * x for _, x in waited],
        "release (that less the containers')": [d * x - containers - per_gpu * j["gpus_asked"] for j, x in waited],
        "iteration beyond compute (replay's 1-GPU jobs)": iteration,
    }


if __name__ == "__main__":
    raise SystemExit(main())
