"""make report's blocks from the benchmarks' committed records (results/bench/<UTC time>-<commit>-<benchmark>.json,
written by a benchmark's --json) and the other benchmark records under results/ (engine.py merges BLOCKS).

A block is a function of the demo records (unused here) that returns the block's text; it reads every committed
record of its benchmark, oldest first, one row per record (or per record and row), so a new run adds a row and
never changes an old one.
"""
from __future__ import annotations

import json
import statistics
import textwrap
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class ReportError(Exception):
    pass


BENCH = ROOT / "results" / "bench"


def read_text(path: Path) -> str:
    """A record's text; ReportError names the file when it cannot be read."""
    try:
        return path.read_text()
    except OSError as e:
        raise ReportError(f"{path}: cannot read the record: {e}") from None


def _record(path: Path) -> dict:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: cannot read the record: {e}") from None


def bench_records(name: str, directory: Path | None = None) -> list[tuple[str, dict]]:
    """(stem, record) of every committed record of benchmark `name`, oldest first."""
    out = []
    for path in sorted((directory or BENCH).glob(f"*-{name}.json")):
        out.append((path.stem.removesuffix(f"-{name}"), _record(path)))
    return out


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _mmm(lo: float, mid: float, hi: float) -> str:
    return f"{mid:.1f} ({lo:.1f}–{hi:.1f}) ms"


def reconfig(_records: list) -> str:
    rows = ["| record | rack | OCS ports | change | end to end: REST request → forwarding confirmed "
            "| less the switching time | the event's overhead (from its start) | before the event starts "
            "| switch programming | of it inside the dark window | load average (1 min) at start → end |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for stem, data in bench_records("bench_reconfig"):
        load = data.get("load_average") or {}
        seen = [f"{x[0]:.1f}" if x else "?" for x in (load.get("start"), load.get("end"))]
        load_cell = " → ".join(seen) if load else "unrecorded"
        for r in data["results"]:
            if "e2e_median_ms" not in r:
                continue
            e2e = _mmm(r["e2e_min_ms"], r["e2e_median_ms"], r["e2e_max_ms"])
            driver = ", NETCONF OCS" if r.get("driver") == "netconf" else ""
            driver += " via SSH" if r.get("transport") == "ssh" else ""
            rows.append(f"| `{stem}` | {r['gpus']} GPUs{' (bare)' if r.get('bare') else ''}{driver} | {r['ports']:,} "
                        f"| {r['circuits']} circuit{_s(r['circuits'])} | {e2e} "
                        f"| {r['e2e_overhead_median_ms']:.1f} ms | {_mmm(r['min_ms'], r['median_ms'], r['max_ms'])} "
                        f"| {r['before_event_ms_median']:.1f} ms | {r['programming_ms_median']:.1f} ms "
                        f"| {r['programming_in_dark_ms_median']:.1f} ms | {load_cell} |")
    return "\n".join(rows)


def reconfig_netconf(_records: list) -> str:
    """Where a change over NETCONF via SSH spends its time beyond switching (bench_reconfig's `netconf` split): the
    driver's whole time, each RPC's round trip, the client's own time, the CPU per change of netconfd, of the front
    before it, of our sshd's sessions and of the emulation's agent, and how long after the commit the agent had the
    bridge done. A record whose changes each waited for the agent's last one is marked *."""
    rpcs = ("lock", "edit-config", "commit", "get-config", "confirm", "unlock")
    rows = ["| record | change | end to end beyond the switching time (OpenFlow's in the same run) | driver (all "
            "of it) | " + " | ".join(rpcs) + " | client's own | waiting out the mirrors | CPU per change: netconfd, "
            "front, sshd's sessions, agent (+ its ovs-ofctl runs) | agent: commit → bridge done |",
            "| --- | --- | --- | --- | " + " | ".join("---" for _ in rpcs) + " | --- | --- | --- | --- |"]
    for stem, data in bench_records("bench_reconfig"):
        for r in data["results"]:
            n = r.get("netconf")
            if not n:
                continue
            cpu = n["cpu_ms_per_change"]
            front = f"{cpu['front']:.1f}" if "front" in cpu else "–"  # (records before the front had none)
            ofctl = f" (+{cpu['agent_ovs_ofctl']:.1f})" if "agent_ovs_ofctl" in cpu else ""  # (older records lack it)
            of = [o for o in data["results"] if o.get("driver") == "openflow" and o["circuits"] == r["circuits"]]
            beside = f" ({of[0]['e2e_overhead_median_ms']:.1f} ms)" if of else " (none)"
            settled = "*" if n.get("next_change_after_agent") else ""  # each change waited for the agent's last
            rows.append(f"| `{stem}`{settled} | {r['circuits']} circuit{_s(r['circuits'])} | "
                        f"{r['e2e_overhead_median_ms']:.1f} ms{beside} | {n['driver_ms_median']:.1f} ms | "
                        + " | ".join(f"{n['rpc_ms_median'][x]:.1f} ms" for x in rpcs)
                        + f" | {n['client_ms_median']:.1f} ms | {n['switching_wait_ms_median']:.1f} ms "
                        f"| {cpu['netconfd']:.1f}, {front}, {cpu['ssh']:.1f}, {cpu['agent']:.1f}{ofctl} ms "
                        f"| {n['agent_after_commit_ms_median']:.1f} ms |")
    if len(rows) == 2:
        rows.append("| no record of a change over NETCONF via SSH yet | | | | " + " | ".join("" for _ in rpcs)
                    + " | | | | |")
    return "\n".join(rows)


def loopback(_records: list) -> str:
    rows = ["| record | ring | rounds × iterations | per all-reduce, median (min–max) over the rounds "
            "| per step | the model's constant (per step) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for stem, data in bench_records("bench_loopback"):
        r, cmd = data["results"], data["command"]
        rounds = r["allreduce_ms"]["n"]
        iterations = cmd[cmd.index("--iterations") + 1] if "--iterations" in cmd else "40"
        a, s = r["allreduce_ms"], r["step_ms"]
        rows.append(f"| `{stem}` | {r['ranks']} ranks, {r['steps']} steps, {r['gradient_bytes']} B "
                    f"| {rounds} × {iterations} | {_mmm(a['min'], a['median'], a['max'])} "
                    f"| {_mmm(s['min'], s['median'], s['max'])} | {r['model_step_ms']:.2f} ms |")
    return "\n".join(rows)


def step(_records: list) -> str:
    """bench_allreduce's cost of a ring step beyond its bytes: at the paper cases' gradient (the model's STEP_S) and
    for a tiny one (what is left of it without bytes)."""
    from evidence.calibration import STEP_RECORD
    from simulator.model.calibration import STEP_S

    rows = ["| record | ring | gradient | iterations | % of the bound, median (min–max) | per step beyond the bound "
            "| per all-reduce | the model's constant (per step) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name in ("bench_allreduce-vgg16-chunk", "bench_allreduce-tiny"):
        for stem, data in bench_records(name):
            r = data["results"]
            b, f = r["step_beyond_bound_ms"], r["percent_of_bound"]
            used = f"{1000 * STEP_S:.2f} ms" if f"{stem}-{name}.json" in STEP_RECORD else "-"
            rows.append(f"| `{stem}-{name.removeprefix('bench_allreduce-')}` | {len(r['ring'])} ranks, {r['steps']} "
                        f"steps | {r['gradient_bytes']:,} B | {b['n']} | {f['median']:.1f} ({f['min']:.1f}–"
                        f"{f['max']:.1f}) % | {_mmm(b['min'], b['median'], b['max'])} "
                        f"| {r['steps'] * b['median']:.1f} ms | {used} |")
    return "\n".join(rows)


def step_by_chunk(_records: list) -> str:
    """bench_allreduce at the chunk sizes the trace rack's jobs send (evidence/calibration.py SMALL_STEP_RECORDS and
    LARGE_STEP_RECORDS): the step cost by chunk, and the constant the model charges each."""
    from evidence import calibration as measured
    from simulator.model import calibration as cal

    rows = ["| record | line rate | ring | chunk (S/n) | per step beyond the bound, median (min–max) "
            "| the model's constant |", "| --- | --- | --- | --- | --- | --- |"]
    found = []
    for rel in measured.SMALL_STEP_RECORDS + measured.LARGE_STEP_RECORDS:
        path = ROOT / rel
        if not path.exists():
            raise ReportError(f"{rel}: the step record evidence/calibration.py names is not committed")
        r = _record(path)["results"]
        found.append((r["gradient_bytes"] / len(r["ring"]), path.stem, r))
    for chunk, stem, r in sorted(found, key=lambda x: (x[0], x[2]["line_mbps"])):
        b = r["step_beyond_bound_ms"]
        used = cal.SMALL_STEP_S if chunk <= cal.SMALL_CHUNK_BYTES else cal.STEP_S
        rows.append(f"| `{stem}` | {r['line_mbps']:g} Mbit/s | {len(r['ring'])} ranks | {chunk / 1000:.1f} kB "
                    f"| {_mmm(b['min'], b['median'], b['max'])} | {1000 * used:.2f} ms |")
    return "\n".join(rows)


# --- checkpoint cost (scripts/bench_failover.py --checkpoint-cost; records at results/bench-checkpoint-cost*) -----
RESULTS = ROOT / "results"
CHECKPOINT_COST = ("bench-checkpoint-cost.json", "bench-checkpoint-cost-titanv.json")


def _field(path: Path, data: dict, *keys: str):
    for k in keys:
        if not isinstance(data, dict) or k not in data:
            raise ReportError(f"{path}: the record has no {'.'.join(keys)}")
        data = data[k]
    return data


def _gpu_models(gpus: list[str]) -> str:
    from controller.core.rack import load_rack

    rack = load_rack(ROOT / "topologies" / "paper-spares.yaml")
    models = sorted({rack.gpus[g].model if g in rack.gpus else "?" for g in gpus})
    return f"{len(gpus)} x {' + '.join(m.replace('TitanV', 'Titan V') for m in models)}"


def checkpoint_cost(_records: list, directory: Path | None = None) -> str:
    """The same job with checkpoints every K iterations and with none, alternately, in pairs: the mean iteration
    (median over the pairs), each pair's cost, and what a save holds the loop for / the copy to the peer takes."""
    rows = ["| record | job | mean iteration, checkpoints every K / none (median of the pairs) | cost per pair "
            "| each save: loop held / copy at the peer (median) |",
            "| --- | --- | --- | --- | --- |"]
    for name in CHECKPOINT_COST:
        path = (directory or RESULTS) / name
        r = _field(path, _record(path), "results")
        m, pairs = _field(path, r, "median"), _field(path, r, "pairs")
        costs = ", ".join(f"{'+' if p['cost'] >= 0 else '-'}{abs(100 * p['cost']):.2f} %" for p in pairs)
        rows.append(f"| `{name}` | {_gpu_models(_field(path, r, 'gpus'))} (K = {r['checkpoint_every']}) "
                    f"| {m['mean_iteration_s_with']:.3f} / {m['mean_iteration_s_without']:.3f} s | {costs} "
                    f"| {1000 * m['local_s']:.1f} ms / {m['save_s']:.3f} s |")
    return "\n".join(rows)


# --- planning and the state store (scripts/bench_placement.py, scripts/bench_store.py --json) -------------------
def _runs(name: str, directory: Path | None) -> list[tuple[str, dict]]:
    found = bench_records(name, directory)
    if not found:
        raise ReportError(f"no committed {name} record under {directory or BENCH} (run it with --json)")
    return found


def _which(found: list[tuple[str, dict]], name: str) -> str:
    return f"{len(found)} run{_s(len(found))}: " + ", ".join(f"`{stem}-{name}.json`" for stem, _ in found)


def _prose(text: str) -> str:
    """A sentence under a table, wrapped as the docs' prose is (a record's name is never split)."""
    return textwrap.fill(text, width=105, break_long_words=False, break_on_hyphens=False)


def signed(x: float, digits: int = 1) -> str:
    """'+1.2' or '−1.2' (a typographic minus; never '−0.0')."""
    v = round(x, digits)
    return f"{'−' if v < 0 else '+'}{abs(v):.{digits}f}"


def placement(_records: list, directory: Path | None = None) -> str:
    """Planning time of one job on generated half-full racks: per cell the range of the runs' medians and, in
    brackets, the largest single time of all runs."""
    found = _runs("bench_placement", directory)
    cells: dict[tuple, list[dict]] = {}
    for _, data in found:
        for r in data["results"]:
            cells.setdefault((r["gpus"], r["switches"], r["ocs"], r["kind"]), []).append(r)
    sizes = sorted({r["job_gpus"] for _, d in found for r in d["results"]})
    rows = ["| GPUs (switches, OCS) | job | " + " | ".join(
        f"{n} GPUs: median (max)" if i == 0 else f"{n} GPUs" for i, n in enumerate(sizes)) + " |",
        "| --- | --- |" + " --- |" * len(sizes)]
    for (gpus, switches, ocs, kind), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][3])):
        out = []
        for n in sizes:
            xs = [r for r in rs if r["job_gpus"] == n]
            if not xs:
                out.append("-")
                continue
            meds = [r["median_ms"] for r in xs]
            out.append(f"{min(meds):.2f}–{max(meds):.2f} ms ({max(r['max_ms'] for r in xs):.2f})")
        rows.append(f"| {gpus:,} ({switches}, {ocs}) | {kind} | " + " | ".join(out) + " |")
    rows.append("")
    rows.append(_prose(f"From {_which(found, 'bench_placement')}."))
    return "\n".join(rows)


def store(_records: list, directory: Path | None = None) -> str:
    """One save of the controller's state: per size the range of the runs' medians, min / max of all saves, and
    each run's median at the largest size over its median at the smallest."""
    found = _runs("bench_store", directory)
    by_size: dict[int, list[dict]] = {}
    for _, data in found:
        for r in data["results"]["sizes"]:
            by_size.setdefault(r["recorded_jobs"], []).append(r["save_ms"])
    ratios = [d["results"]["ratio_largest_to_smallest"] for _, d in found]
    rows = ["| recorded jobs | median (range over the runs) | min / max of all saves | median at the largest / at "
            "the smallest |", "| --- | --- | --- | --- |"]
    for i, (n, ss) in enumerate(sorted(by_size.items())):
        meds = [x["median"] for x in ss]
        last = f"{min(ratios):.2f}–{max(ratios):.2f}" if i == len(by_size) - 1 else ""
        rows.append(f"| {n:,} | {min(meds):.2f}–{max(meds):.2f} ms | {min(x['min'] for x in ss):.2f} / "
                    f"{max(x['max'] for x in ss):.1f} ms | {last} |")
    rows.append("")
    rows.append(_prose(f"From {_which(found, 'bench_store')}, {found[0][1]['results']['saves']} saves per size each."))
    return "\n".join(rows)


def observed(_records: list, directory: Path | None = None) -> str:
    """bench_allreduce --observed: the ring's share of its bound without, then with, the live page open and
    Prometheus scraping, alternately in one run (one column per committed run)."""
    found = _runs("bench_allreduce-observed", directory)
    got = []
    for stem, data in found:
        o = data["results"].get("observed")
        if not o:
            raise ReportError(f"{stem}-bench_allreduce-observed.json: the record has no 'observed' "
                              "(run with --observed)")
        got.append(o)
    head = " | ".join(f"run {i + 1}" for i in range(len(got)))
    rows = [f"| | {head} |", "| --- |" + " --- |" * len(got),
            f"| without the page and Prometheus (mean of {len(got[0]['plain_percent'])} rings) | "
            + " | ".join(f"{o['plain_mean_percent']:.1f} %" for o in got) + " of the bound |",
            "| with the page open, Prometheus scraping every 5 s | "
            + " | ".join(f"{o['observed_mean_percent']:.1f} %" for o in got) + " of the bound |",
            "| difference (without − with) | " + " | ".join(signed(o["difference_points"]) for o in got)
            + " percentage points |",
            "", _prose(f"From {_which(found, 'bench_allreduce-observed')}.")]
    return "\n".join(rows)


def rack(_records: list, directory: Path | None = None) -> str:
    """bench_rack: the images' sizes and what bringing the rack up and down takes, one column per record."""
    found = _runs("bench_rack", directory)

    def mb(n):
        return f"{n / 1e6:,.0f} MB" if n else "-"

    def secs(d):
        return f"{d['median']:.1f} s ({d['min']:.1f}–{d['max']:.1f}, {d['n']} runs)"

    got = [d["results"] for _, d in found]
    rows = ["| what | " + " | ".join(f"`{stem}`" for stem, _ in found) + " |", "| --- |" + " --- |" * len(found),
            "| worker image | " + " | ".join(mb(r["image_bytes"].get("worker")) for r in got) + " |",
            "| NIC helper image | " + " | ".join(mb(r["image_bytes"].get("nic_helper")) for r in got) + " |",
            "| first rack-up after `down --purge` (push to the registry, every engine pulls both images) | "
            + " | ".join(f"{r['cold_up_s']:.1f} s" if r.get("cold_up_s") else "-" for r in got) + " |",
            "| later rack-up (cached image stores), median (min–max) | " + " | ".join(secs(r["up_s"]) for r in got)
            + " |",
            "| rack-down | " + " | ".join(secs(r["down_s"]) for r in got) + " |"]
    return "\n".join(rows)


QUICK = ROOT / "results" / "netconf-quick" / "records"


def netconf_quick(_records: list, directory: Path | None = None) -> str:
    """Quick demos (`make demo ARGS="--quick --results results/netconf-quick"`, case (a) once) on the paper rack
    with its OCS over OpenFlow and over NETCONF (topologies/paper-netconf.yaml), one row per record, and whether
    the NETCONF runs' savings fall within the OpenFlow runs' range."""
    from evidence import records as rec

    found = rec.load(directory or QUICK)
    if not found:
        raise ReportError(f"{directory or QUICK}: no committed record")
    rows = ["| record | commit | OCS driver | fragmented | regrouped | completion time saved (case (a)) |",
            "| --- | --- | --- | --- | --- | --- |"]
    savings: dict[str, dict[str, list[float]]] = {}  # commit -> driver -> savings: runs made together compared
    for r in found:
        d = r.data
        driver = "netconf" if any(o.get("driver") == "netconf" for o in d["rack"].get("ocs", [])) else "openflow"
        p = next(p for p in d["points"] if p["case"] == "a")
        commit = d["versions"].get("optirack")
        savings.setdefault(commit, {"openflow": [], "netconf": []})[driver].append(p["saving"]["median"])
        name = "NETCONF" if driver == "netconf" else "OpenFlow"
        rows.append(f"| `{r.name}` | {commit} | {name} "
                    f"| {p['fixed']['completion_rack_s']:.2f} s | {p['regroup']['completion_rack_s']:.2f} s "
                    f"| {100 * p['saving']['median']:.1f} % |")
    rows.append("")
    for commit, by in savings.items():
        of, nc = by["openflow"], by["netconf"]
        if not of or not nc:
            raise ReportError(f"{directory or QUICK}: the runs at {commit} need records of both drivers")
        lo, hi = min(of), max(of)
        inside = sum(lo <= s <= hi for s in nc)
        rows.append(_prose(f"At {commit}: OpenFlow {len(of)} run{_s(len(of))}, saved {100 * statistics.median(of):.1f} "
                           f"% at the median ({100 * lo:.1f}–{100 * hi:.1f} %); NETCONF {len(nc)} run{_s(len(nc))}, "
                           f"{100 * statistics.median(nc):.1f} % ({100 * min(nc):.1f}–{100 * max(nc):.1f} %); "
                           f"{inside} of {len(nc)} within the OpenFlow runs' range."))
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[list], str]] = {
    "reconfig": reconfig, "reconfig-netconf": reconfig_netconf,
    "loopback": loopback, "step": step, "step-by-chunk": step_by_chunk,
    "checkpoint-cost": checkpoint_cost, "placement": placement, "store": store,
    "observed": observed, "rack": rack, "netconf-quick": netconf_quick,
}
