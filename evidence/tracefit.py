"""Where the emulation's lags (simulator/model/lags.py) come from: each measured from committed records, in the
fit's host's units.

`python -m evidence.tracefit` reads the trace replay records (results/replay/, scripts/replay_trace.py) made with the
host's probe and prints, in emulated seconds on the fit's host (each replay's seconds divided by its host factor,
lags.host_factor: its probe against PROBE_S, the probe's median over the fit's policy runs) and rack seconds:
- probe: each policy run's probe (its jobs' GPUs granted to first iteration, summed), whose median is PROBE_S;
- containers: submit to `started_at` of the jobs placed at once (no other job's end between their submit, less
  RELEASE_WINDOW_S, and their start), less a per-GPU part (the least-squares slope within the queue drains);
- start: start to the first iteration (every rank's first iteration begins together: the ring's rendezvous), a
  least-squares plane on the GPUs starting at its admission (its own and those of jobs admitted before it not yet
  at their first iteration) and the GPUs of other jobs iterating then;
- the spread around both: each job's measured lag over the least squares', the standard deviation of its log for
  the containers' and the start lag and the two logs' correlation (the draws of tracesim's ensemble, lags.draws);
- end and iteration: the 1-GPU jobs (no all-reduce): their first iteration to `ended_at` less the profile's compute,
  a least-squares line on their iterations: the intercept is the end (the ranks' exit, the controller seeing it),
  the slope each iteration's cost beyond its compute;
- release: `ended_at` of the last job to end before a queued job's start to that start, less the containers' part
  (the jobs that waited);
- what is left after the first iteration: each job's emulated time per iteration against the simulator's for the
  same GPUs alone on the rack (with and without the per-iteration lag), by job size and switches.
`--repeatability` instead sets the replay records against each other, job by job (the emulation's own spread: the
floor under the trace check's bounds).
A pure reading of the records: it predicts nothing (the model is simulator/model/, known by its fingerprint).
tests/unit/test_tracefit.py ties lags.py's constants to what this prints for the committed records (REPLAYS).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIT_SET = ("20261206T102947Z-669a8da", "20261206T103904Z-669a8da", "20261206T110447Z-669a8da",
           "20261206T111416Z-669a8da")
# The fit set (docs/trace-model.md's rule): every replay with the host's probe of trace16.csv and trace16-small.csv
# made from the main line on 2026-12-06 before the freeze, none dropped
REPLAYS = tuple(ROOT / "results" / "replay" / f"{s}.json" for s in FIT_SET)
# make demo records with a detailed job log: each rank's first iteration (the ranks start iterating together)
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


def starting(jobs: list[dict]) -> list[int]:
    """Per job (the rows' order): the GPUs starting at its admission, as the engine counts them: its own and those
    of the jobs admitted at or before it and not yet at their first iteration (their containers and torch's import
    share the host's cores)."""
    return [sum(o["gpus_asked"] for o in jobs if o["admit_s"] <= j["admit_s"] < o["first_iteration_s"] or o is j)
            for j in jobs]


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


def lstsq(rows: list[list[float]], y: list[float]) -> list[float]:
    """Least squares y = rows . b (numpy's)."""
    import numpy as np

    return [float(v) for v in np.linalg.lstsq(np.array(rows, dtype=float), np.array(y, dtype=float), rcond=None)[0]]


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


def per_iteration(runs: list[tuple[list[dict], float]], rack_file: Path, lags_on: bool) -> list[dict]:
    """Each replayed job's emulated time per iteration after the first (end lag out) beside the simulator's for
    its GPUs alone on the rack (rack s), the lags at its replay's host factor; `runs`: (jobs, host factor)."""
    from controller.core.rack import load_rack
    from evidence import tracecheck
    from simulator.model import lags
    from simulator.model.engine import Options

    rack = load_rack(rack_file)
    d = rack.spec.emulation.time_dilation
    cal, _ = tracecheck.calibration_for(rack.spec.emulation.fabric)
    out = []
    for jobs, h in runs:
        charged = lags.Lags(iteration_s=h * lags.ITERATION_S / d, iteration_per_gb_s=h * lags.ITERATION_PER_GB_S / d) \
            if lags_on else lags.NONE
        opts = Options(net=cal.net(rack), step_model="exact", lags=charged)
        for j in jobs:
            out.append(_per_iteration(j, rack, opts, h * lags.END_S / d))
    return out


def _per_iteration(j: dict, rack, opts, end_s: float) -> dict:
    from simulator.inputs.workloads import JobSpec
    from simulator.model import models
    from simulator.model.engine import Run, policies

    spec = JobSpec("x", 0.0, j["gpus_asked"], j["model"], j["iterations"], names=tuple(j["gpus"]), policy="fixed")
    sim = Run(rack, [spec], policies(300.0)["fixed"], opts).run().jobs[0].alone_iteration_s
    emu = (j["end_s"] - j["first_iteration_s"] - end_s) / j["iterations"]
    compute = max(models.cost(j["model"], [rack.gpus[g].model for g in j["gpus"]], 4, 0.0, 1.0).compute_s)
    return {"index": j["index"], "gpus": j["gpus_asked"], "switches": len(j["switches"]),
            "model": j["model"], "emulated_s": emu, "simulated_s": sim, "compute_s": compute}


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
    from simulator.model import lags

    seconds = probes(records)
    if not seconds:
        print("tracefit: no --replay record has the host's probe", file=sys.stderr)
        return 2
    probe_s = statistics.median(seconds)
    try:
        runs = host_runs(records, probe_s)
    except ValueError as e:
        print(f"tracefit: {e}", file=sys.stderr)
        return 2
    dj = [x for r in demos for x in demo_jobs(r)]
    rack_file = ROOT / records[0]["rack_file"]
    fig = fit(runs, dj, d, rack_file)
    print(f"{', '.join(p.stem for p in args.replay)}: {len(runs)} policy runs, {sum(len(j) for j, _ in runs)} jobs; "
          f"the fit's host's emulated s (rack s at dilation {d:g}):")
    print(f"  probe (the fit's host, PROBE_S): {_fmt(seconds, d)}")
    for p, r in zip(args.replay, records, strict=True):
        print(f"  {p.stem}: host factor {lags.host_factor(r) * lags.PROBE_S / probe_s:.3f}")
    for k, v in fig.items():
        unit = "" if "log" in k else " s"  # the spread's figures are of logs: no unit
        print(f"  {k}: {_fmt(v, d) if isinstance(v, list) else f'{v:.3f}{unit}'}")
    rows = per_iteration(runs, rack_file, False)
    with_lag = per_iteration(runs, rack_file, True)
    print("  after the first iteration, emulated per iteration / simulated alone (median; min-max):")
    for label, pick in (("1 GPU", lambda r: r["gpus"] == 1), ("one switch, 2+ GPUs",
                                                               lambda r: r["gpus"] > 1 and r["switches"] == 1),
                        ("2+ switches", lambda r: r["switches"] > 1),
                        ("resnet50, 2+ GPUs", lambda r: r["gpus"] > 1 and r["model"] == "resnet50"),
                        ("vgg16, 2+ GPUs", lambda r: r["gpus"] > 1 and r["model"] == "vgg16"),
                        ("all", lambda r: True)):
        for name, rs in (("without", rows), ("with", with_lag)):
            q = [r["emulated_s"] / r["simulated_s"] for r in rs if pick(r)]
            if q:
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


def host_runs(records: list[dict], probe_s: float | None = None) -> list[tuple[list[dict], float]]:
    """Every policy run of each replay record (its jobs that ended done) with its record's host factor
    (lags.host_factor; against `probe_s` in place of lags.PROBE_S where given); a record without the host's probe is
    an error: it cannot be put in the fit's host's units."""
    from simulator.model import lags

    out = []
    for r in records:
        h = lags.host_factor(r)
        if h is not None and probe_s is not None:
            h = h * lags.PROBE_S / probe_s
        if h is None:
            raise ValueError(f"the replay of {r.get('started_utc') or r.get('trace_file')} has no host's probe")
        out += [([j for j in run["jobs"] if j["state"] == "done"], h) for run in r["policies"].values()]
    return out


def probes(records: list[dict]) -> list[float]:
    """Every policy run's probe seconds (lags.probe_seconds), emulated s, over the records."""
    from simulator.model import lags

    return [x for r in records for run in r["policies"].values()
            if (x := lags.probe_seconds(run, r["time_dilation"])) is not None]


def _fmt(values: list[float], d: float) -> str:
    return (f"{statistics.median(values):.3f} s ({statistics.median(values) / d:.3f} rack s; median, "
            f"{min(values):.3f}-{max(values):.3f}, {len(values)} values)")


def fit(runs: list[tuple[list[dict], float]], demo: list[dict], d: float,
        rack_file: Path) -> dict[str, list[float] | float]:
    """The lags' figures in the fit's host's emulated s: each a list of measured values (its median is the lag) or a
    fitted number. `runs`: replays' policy runs, each (its jobs, rack s at dilation `d`; its replay's host factor),
    pooled (queue drains, bursts and releases are each run's own), each value divided by its run's factor; `demo`:
    demo_jobs of the demo records (the ranks' first iterations only: those records have no probe)."""
    from controller.core.rack import load_rack
    from simulator.model import models

    rack = load_rack(rack_file)
    # each run's rack seconds in the fit's host's emulated seconds
    k = {id(jobs): d / h for jobs, h in runs}
    every = [(jobs, j) for jobs, _ in runs for j in jobs]
    starting_now = [float(x) for jobs, _ in runs for x in starting(jobs)]
    busy = [x for jobs, _ in runs for x in iterating_at(jobs)]
    load = [[1.0, x, y] for x, y in zip(starting_now, busy, strict=True)]
    granted = [k[id(jobs)] * (j["start_s"] - j["admit_s"]) for jobs, j in every]
    containers, per_gpu, per_busy_c = lstsq(load, granted)
    delays = [k[id(jobs)] * (j["first_iteration_s"] - j["start_s"]) for jobs, j in every]
    start, per_placed, per_busy = lstsq(load, delays)
    ones = [(jobs, j) for jobs, j in every if j["gpus_asked"] == 1]
    costs = [models.cost(j["model"], [rack.gpus[j["gpus"][0]].model], 4, 0.0, 1.0) for _, j in ones]
    # the emulated compute is the worker's sleep (rack s x dilation), not the host's work: out before the factor
    tail = [k[id(jobs)] * (j["end_s"] - j["first_iteration_s"] - j["iterations"] * c.compute_s[0])
            for (jobs, j), c in zip(ones, costs, strict=True)]
    end, per_gb = line([j["iterations"] * c.gradient_bytes / 1e9 for (_, j), c in zip(ones, costs, strict=True)], tail)
    # the spread: each job's measured lag over the least squares'
    log_c = [math.log(g / (containers + per_gpu * x + per_busy_c * y))
             for g, (_, x, y) in zip(granted, load, strict=True)]
    log_s = [math.log(v / (start + per_placed * x + per_busy * y)) for v, (_, x, y) in zip(delays, load, strict=True)]
    load_of = {id(j): (x, y) for (_, j), (_, x, y) in zip(every, load, strict=True)}
    waited = [(j, k[id(jobs)] * x) for jobs, _ in runs for j, x in release_rows(jobs)]
    return {
        "GPUs granted to containers started": granted,
        "containers: a, least squares on the GPUs starting and those iterating at its admission": containers,
        "containers: per GPU starting": per_gpu,
        "containers: per GPU of other jobs iterating": per_busy_c,
        "start to first iteration": delays,
        "start: a, least squares on the GPUs starting and those iterating at its admission": start,
        "start: per GPU starting": per_placed,
        "start: per GPU of other jobs iterating": per_busy,
        "containers: log of measured over the least squares', standard deviation": statistics.pstdev(log_c),
        "start: log of measured over the least squares', standard deviation": statistics.pstdev(log_s),
        "the two logs' correlation": statistics.correlation(log_c, log_s),
        "start to every rank's first iteration (demo)": [statistics.median(x["start"]) for x in demo],
        "ranks' first iterations apart (demo), at most": max(max(x["start"]) - min(x["start"]) for x in demo)
        if demo else 0.0,
        "1-GPU jobs, first iteration to ended_at beyond compute": tail,
        "end (the line's intercept on the 1-GPU jobs' iterations x gradient GB)": end,
        "iteration beyond compute, per GB of gradient (the line's slope)": per_gb,
        "ended_at to the next start": [x for _, x in waited],
        "release (that less the containers')": [x - containers - per_gpu * load_of[id(j)][0]
                                                - per_busy_c * load_of[id(j)][1] for j, x in waited],
    }


if __name__ == "__main__":
    raise SystemExit(main())
