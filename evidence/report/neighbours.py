"""make report's blocks for the neighbours' pages (docs/neighbour-*.md; engine.py merges BLOCKS), each the
paper's figure beside ours from the records of `python scripts/neighbours.py all` (results/neighbours/*.json) and
the 4,096-GPU run of them all (results/simulate-4096-neighbours/summary.md). A record that is missing or lacks
what a block needs raises ReportError naming the file."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from evidence.report.bench import ROOT, ReportError, read_text
from evidence.report.sim import FIELD, _rows, _table

RESULTS = ROOT / "results"
ORDER = ["regroup", "switchml", "panama", "ideal"]  # the collectives' rows: ring, single tree, PANAMA, the bound


# The records name each paper by the number of the project's list of neighbours' papers; a reader has the papers.
PAPERS = {"seed 001": "ODDL, Li et al., OFC 2023", "seed 002": "PANAMA, Gebara, Costa and Ghobadi, MLSys 2021",
          "seed 003": "Ghobadi, \"Networks for Machine Learning Jobs\"",
          "seed 004": "SiP-ML, Khani et al., SIGCOMM 2021"}


def cite(source: str) -> str:
    """A record's source with each paper named, not numbered."""
    for seed, paper in PAPERS.items():
        source = source.replace(seed, paper)
    return source.replace(" (from the issue and the abstract; not in shared/papers)", " (from its abstract)")


def _load(name: str, results: Path) -> dict:
    path = results / "neighbours" / f"{name}.json"
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not JSON: {e}") from None


def _get(d: dict, *keys, where: str):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            raise ReportError(f"{where}: no {'.'.join(map(str, keys))}")
        d = d[k]
    return d


def _s(x: float) -> str:
    return f"{x * 1e3:,.1f} ms" if x < 1 else f"{x:,.1f} s" if x < 100 else f"{x:,.0f} s"


def _pct(x: float) -> str:
    return f"{x:+.1f} %".replace("-", "−")


def _delay(d: float) -> str:
    return f"{d * 1e9:g} ns" if d < 1e-6 else f"{d * 1e6:g} µs" if d < 1e-3 else f"{d * 1e3:g} ms"


def _made(rec: dict) -> str:
    return f"`{rec['command']}` at {rec['commit']}"


# --- ODDL ---------------------------------------------------------------------------------------
def oddl_table1(_records: list, results: Path = RESULTS) -> str:
    rec = _load("oddl-table1", results)
    where = "results/neighbours/oddl-table1.json"
    paper, ours = _get(rec, "paper", where=where), _get(rec, "ours", where=where)
    gap_p = paper["oddl_min"] / paper["electrical_min"] - 1
    gap_o = ours["oddl_min"] / ours["electrical_min"] - 1
    # the per-circuit overhead that would give the paper's gap in our model: 6 steps, 2 circuits each (2x2 grid)
    per_iteration = ours["electrical_min"] * 60 / ours["iterations"]
    needed = gap_p * per_iteration / (6 * 2)
    rows = [["training time, ODDL", f"{paper['oddl_min']} min", f"{ours['oddl_min']:,.1f} min"],
            ["training time, one electrical switch", f"{paper['electrical_min']} min",
             f"{ours['electrical_min']:,.1f} min"],
            ["ODDL against the electrical switch", _pct(100 * gap_p), _pct(100 * gap_o)]]
    return (_rows(["4 nodes, ResNet50, 20 epochs", f"paper ({cite(paper['source'])})",
                   f"ours (V100 profile, ring, {ours['iterations']:,} iterations of batch 16 x 4)"], rows)
            + f"\n\nIn our model the paper's gap would take {needed * 1e6:,.0f} µs of set-up per circuit "
            f"(6 steps of 2 circuits, {per_iteration * 1e3:.1f} ms an iteration). Made by {_made(rec)}.")


def oddl_scale(_records: list, results: Path = RESULTS) -> str:
    rec = _load("oddl-scale", results)
    rows, seeds = [], None
    for gpus in _get(rec, "sizes", where="oddl-scale"):
        run = _get(rec, "runs", str(gpus), where="results/neighbours/oddl-scale.json")
        p = run["policies"]
        seeds = run.get("seeds")

        def jct(name: str, p=p) -> str:
            s = p[name].get("seeds")
            if not s:
                return _s(p[name]["jct_s"]["mean"])
            m, vs = s["jct_mean"], s["jct_mean_vs_baseline"]
            return (f"{_s(m['mean'])} ± {_s(m['ci95'])}" if name == "static" else
                    f"{_s(m['mean'])} ({_pct(vs['mean'])} ± {vs['ci95']:.1f} %)")
        rows.append([f"{gpus:,}", run["workload"].split(",")[0], jct("static"), jct("regroup"), jct("oddl"),
                     f"{p['static']['shared_jobs']} / {p['regroup']['shared_jobs']} / {p['oddl']['shared_jobs']}"])
    first = rec["runs"][str(rec["sizes"][0])]["command"]
    over = f"seeds {seeds[0]}–{seeds[-1]}, mean ± 95 % interval" if seeds else "one seed"
    return (_rows(["GPUs", "jobs", f"static: JCT mean ({over})", "MEMS regroup (vs static)", "ODDL (vs static)",
                   "jobs sharing a link, first seed: static / regroup / ODDL"], rows)
            + f"\n\nEach size: `{first}` with --gpus and --jobs as given. Made by {_made(rec)}.")


def oddl_delay(_records: list, results: Path = RESULTS) -> str:
    rec = _load("oddl-delay", results)
    ref = _get(rec, "runs", "reference", "policies", where="results/neighbours/oddl-delay.json")
    regroup, static = ref["regroup"]["jct_s"]["mean"], ref["static"]["jct_s"]["mean"]
    rows = []
    for d in rec["delays_s"]:
        p = _get(rec, "runs", f"{d:g}", "policies", "oddl", where="results/neighbours/oddl-delay.json")
        m = p["jct_s"]["mean"]
        rows.append([_delay(d), _s(m), _pct(100 * (m / regroup - 1)), _pct(100 * (m / static - 1))])
    return (_rows(["ODDL switching per circuit", "JCT mean", "vs MEMS regroup", "vs static"], rows)
            + f"\n\nMEMS regroup {_s(regroup)}, static {_s(static)} (the same workload: "
            f"`{rec['runs']['reference']['command']}`). Made by {_made(rec)}.")


# --- PANAMA -------------------------------------------------------------------------------------
def panama_shortflows(_records: list, results: Path = RESULTS) -> str:
    rec = _load("panama", results)
    fig = _get(rec, "shortflows", where="results/neighbours/panama.json")
    names = [c for c in ("ring-tcp", "ring-ecn", "switchml", "panama", "ideal") if c in fig["p99_s"]]
    rows = [[f"{x:g}", *(f"{fig['p99_s'][c][i] * 1e6:,.1f}" for c in names)] for i, x in enumerate(fig["loads"])]
    paper = rec["paper"]
    return (_rows(["aggregation load", *(f"{c}: p99 µs" for c in names)], rows)
            + f"\n\nThe paper ({cite(paper['source'])}): from worst to best, {', '.join(paper['order'])}; p99 on an "
            f"axis of "
            f"{paper['y_axis_s'][0]:g}–{paper['y_axis_s'][1]:g} s over loads {paper['loads'][0]:g}–"
            f"{paper['loads'][1]:g}. Made by {_made(rec)}.")


def panama_workload(_records: list, results: Path = RESULTS) -> str:
    rec = _load("panama", results)
    work = _get(rec, "workload", where="results/neighbours/panama.json")
    rows = [[p["label"], _s(p["jct_s"]["mean"]), _s(p["jct_s"]["p95"]), f"{100 * p['computing']:.1f} %",
             "baseline" if name == "regroup" else _pct(p["jct_vs_baseline"])]
            for name, p in sorted(work["policies"].items(), key=lambda kv: ORDER.index(kv[0]))]
    return (_rows(["collective", "JCT mean", "JCT p95", "GPUs computing", "JCT mean vs ring (regroup)"], rows)
            + f"\n\n`{work['command']}`: {work['workload']}.")


# --- CASSINI / MLTCP ----------------------------------------------------------------------------
def cassini(_records: list, results: Path = RESULTS) -> str:
    rec = _load("cassini", results)
    rows, notes = [], []
    for r in _get(rec, "rows", where="results/neighbours/cassini.json"):
        x = " / ".join
        rows.append([" + ".join(r["jobs"]), x(f"{v:.2f}x" for v in r["paper_speedup"]),
                     x(f"{v:.2f}x" for v in r["unfair_speedup"]),
                     "yes" if r["paper_compatible"] else "no", "yes" if r["compatible"] else "no",
                     x(f"{v:.2f}x" for v in r["shift_speedup"])])
        if r["why_no_shift_gain"]:
            notes.append(f"- {' + '.join(r['jobs'])}: shifting saved nothing: {r['why_no_shift_gain']}.")
    return (_rows(["jobs on one link", "paper: speed-up from unfairness", "ours: unfair (weights "
                   + ", ".join("/".join(f"{w:g}" for w in r["weights"]) for r in rec["rows"][-2:]) + ")",
                   "paper: compatible", "ours: compatible", "ours: time shifted (CASSINI), fair shares"], rows)
            + ("\n\n" + "\n".join(notes) if notes else "")
            + f"\n\nSpeed-ups against fair sharing from a common start; {rec['gpu']}, rings of {rec['ranks']} on a "
              f"{rec['link_gbps']:g} Gbit/s link. Made by {_made(rec)}.")


# --- TopoOpt / SiP-ML ---------------------------------------------------------------------------
def headline(_records: list, results: Path = RESULTS) -> str:
    rec = _load("headline", results)
    alone = _get(rec, "alone_jct_s", where="results/neighbours/headline.json")
    work = _get(rec, "workload", "policies", where="results/neighbours/headline.json")

    def ratios(fabric: str) -> list[float]:
        return [v["static"] / v[fabric] for v in alone.values()]

    def span(xs: list[float]) -> str:
        return f"{min(xs):.2f}–{max(xs):.2f}x"

    jct = {n: p["jct_s"]["mean"] for n, p in work.items()}
    topo, sip = ratios("topoopt"), ratios("sipml")
    paper = rec["paper"]
    rows = [["TopoOpt-like", f"{paper['topoopt_x']}x", span(topo), f"{jct['static'] / jct['topoopt']:.2f}x",
             "miss" if max(topo) < paper["topoopt_x"] else "within"],
            ["SiP-ML-like", f"{paper['sipml_x'][0]}–{paper['sipml_x'][1]}x", span(sip),
             f"{jct['static'] / jct['sipml']:.2f}x",
             "miss (top of the range)" if max(sip) < paper["sipml_x"][1] else "within"],
            ["MEMS regroup (ours)", "-", "-", f"{jct['static'] / jct['regroup']:.2f}x", "-"]]
    per = "; ".join(f"{k.replace(':', ' on ')} GPUs {v['static'] / v['topoopt']:.2f}x / {v['static'] / v['sipml']:.2f}x"
                    for k, v in alone.items())
    return (_rows(["architecture", "paper: faster than the electrical fat tree", "ours: a job alone (per model "
                   "and size)", "ours: mean JCT of the workload", "paper's figure"], rows)
            + f"\n\nAlone, TopoOpt-like / SiP-ML-like: {per}. Workload: `{rec['workload']['command']}`. "
              f"Paper: {cite(paper['source'])}. Made by {_made(rec)}.")


# --- all of them on one rack ----------------------------------------------------------------------
def all_4096(_records: list, results: Path = RESULTS) -> str:
    path = results / "simulate-4096-neighbours" / "summary.md"
    rows = _table(path, "policy", FIELD, after="## The field's figures")
    last = rows[0]
    vs = next(c for c in last if c.startswith("vs "))
    return _rows(["policy", "JCT mean / p50 / p95 / p99", "slowdown mean / p95", "queueing mean", "steady computing",
                  vs.split(":")[0] + ": JCT mean"],
                 [[r["policy"], r["JCT mean / p50 / p95 / p99"],
                   " / ".join(r["slowdown mean / p50 / p95 / p99"].split(" / ")[::2]),
                   r["queueing mean / p95"].split(" / ")[0], r["steady held / computing"].split(" / ")[1],
                   r[vs].split(",")[0]] for r in rows])


def why_4096(_records: list, results: Path = RESULTS) -> str:
    """The 4,096-GPU run's paragraphs on time shifting and MLTCP against regroup (what each saved, and why not)."""
    path = results / "simulate-4096-neighbours" / "summary.md"
    paras = [line for line in read_text(path).splitlines() if line.startswith(("Time shifting:", "MLTCP:"))]
    if len(paras) != 2:
        raise ReportError(f"{path}: no paragraphs on time shifting and MLTCP (run it with regroup,timeshift,mltcp)")
    return "\n\n".join(paras)


BLOCKS: dict[str, Callable[[list], str]] = {
    "nb-oddl-table1": oddl_table1, "nb-oddl-scale": oddl_scale, "nb-oddl-delay": oddl_delay,
    "nb-panama-shortflows": panama_shortflows, "nb-panama-workload": panama_workload, "nb-cassini": cassini,
    "nb-headline": headline, "nb-4096": all_4096, "nb-4096-why": why_4096,
}


# --- LumosCore ----------------------------------------------------------------------------------
def lumoscore(_records: list, results: Path = RESULTS) -> str:
    rec = _load("lumoscore", results)
    where = "results/neighbours/lumoscore.json"
    rows = []
    for key, run in sorted(_get(rec, "runs", where=where).items(), key=lambda kv: (int(kv[0].split()[0]), kv[0])):
        gpus, fabric = key.split()
        p = run["policies"]
        jobs = run["workload"].split(";")[0].rsplit(", ", 1)[-1]
        rows.append([f"{int(gpus):,}", fabric, f"LLM-like, {jobs}", _s(p["static"]["jct_s"]["mean"]),
                     _s(p["regroup"]["jct_s"]["mean"]), _pct(p["regroup"]["jct_vs_baseline"]),
                     f"{p['static']['shared_jobs']} / {p['regroup']['shared_jobs']}"])
    paper = rec["paper"]
    return (_rows(["GPUs", "uplinks (GPUs' NICs : uplink)", "trace", "static Clos: JCT mean", "regroup: JCT mean",
                   "regroup vs static", "jobs sharing a link: static / regroup"], rows)
            + f"\n\nThe paper: {_pct(paper['jct_mean_change'])} at {paper['gpus']:,} GPUs ({cite(paper['source'])}). "
              f"Made by {_made(rec)}; e.g. `{next(iter(rec['runs'].values()))['command']}`.")


BLOCKS["nb-lumoscore"] = lumoscore
