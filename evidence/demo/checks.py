"""The paper experiment's figures over repeats, its self-checks and what it prints of them (evidence/demo/experiment.py
runs the experiment; this is the pure part: a record in, figures and verdicts out).

A case's figure is the median over the repeats with its spread; the checks say whether the answer holds
(regrouping costs no figure time beyond its repeats' noise, the sweep's savings grow as the uplink slows, no figure
spreads more than MAX_SPREAD_PP), whether the fabric dropped nothing and retransmitted little, and whether the flows
crossing an uplink got their max-min shares; `passed` is all of them. A repeat much slower than the others of its
policy is named with where its time went (`disturbed`).
"""
from __future__ import annotations

import statistics

from emulation import counters
from emulation import shares as sharecheck
from emulation.calibrate import Calibration
from simulator.inputs.cases import CASES

PAPER = {  # Yan et al., OFC 2022, section 3
    "a": {"before_s": 407, "after_s": 109, "reduction": 0.732, "util": "3x"},
    "b": {"before_s": 368, "after_s": 140, "reduction": 0.620, "util": "no significant change"},
}
# What an emulated GPU's "utilization" is: its compute is a wait, so the worker reports compute time over
# iteration time (utilization: busy-fraction), not a GPU's busy counter as the paper measured.
COMPUTE_FRACTION = "compute fraction of an iteration (emulated GPU)"
MAX_SPREAD_PP = 10.0  # what the issue asks of every figure's spread over the repeats
# Regrouping must not cost time beyond the noise its own repeats show: a figure fails when regrouping made the job
# slower (median saving below zero) by more than the figure's spread over its repeats (max - min of the savings,
# in pp). One-sided, so it can fail where a regroup saves little (the 1:1 sweep point); it replaced a two-sided
# "signs kept" check that judged only medians at least 5 pp from zero, under which a regroup costing up to 5 %
# at NIC:uplink 1:1 passed every check.


# --- figures over repeats (pure) -----------------------------------------------------------
def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def point(name: str, case: str, k: float, uplink_gbps: float, pairs: list[tuple[dict, dict]]) -> dict:
    """Median figures of one case on one rack from (fixed, regroup) summaries, one pair per repeat."""
    savings = [1 - g["completion_s"] / f["completion_s"] for f, g in pairs]
    out = {
        "name": name,
        "case": case,
        "nic_to_uplink": k,
        "uplink_gbps": uplink_gbps,
        "repeats": len(pairs),
        "saving": {**spread(savings), "spread_pp": 100 * (max(savings) - min(savings))},
    }
    for i, policy in enumerate(("fixed", "regroup")):
        runs = [p[i] for p in pairs]
        out[policy] = {
            key: statistics.median(r[key] for r in runs)
            for key in (
                "completion_rack_s",
                "mean_iteration_rack_s",
                "mean_compute_rack_s",
                "mean_comm_rack_s",
                "mean_gpu_util",
            )
        }
        out[policy]["mean_iteration_rack_s_values"] = [r["mean_iteration_rack_s"] for r in runs]
    out["disturbed"] = disturbed(pairs)
    return out


SLOW = 0.10  # a repeat whose mean iteration is this much above its policy's median was disturbed


def disturbed(pairs: list[tuple[dict, dict]]) -> list[dict]:
    """The repeats slower than the others of their policy, and where their time went: compute (the
    workers' own phase: the host's CPU), communication (the emulated network), with the host's idle
    and stolen CPU over the run."""
    out = []
    for i, policy in enumerate(("fixed", "regroup")):
        runs = [p[i] for p in pairs]
        if len(runs) < 2:
            continue
        med = {k: statistics.median(r[k] for r in runs) for k in ("mean_iteration_rack_s", "mean_compute_rack_s",
                                                                 "mean_comm_rack_s")}
        for rep, r in enumerate(runs):
            extra = r["mean_iteration_rack_s"] / med["mean_iteration_rack_s"] - 1
            if extra <= SLOW:
                continue
            compute = r["mean_compute_rack_s"] - med["mean_compute_rack_s"]
            comm = r["mean_comm_rack_s"] - med["mean_comm_rack_s"]
            out.append({"policy": policy, "repeat": rep, "slower_by": extra, "compute_extra_rack_s": compute,
                        "comm_extra_rack_s": comm, "by": "compute" if compute > comm else "communication",
                        "host_idle_percent": r.get("host_idle_percent"),
                        "host_steal_percent": r.get("host_steal_percent")})
    return out


def regroup_cost(p: dict) -> dict:
    """What regrouping cost one figure against the noise of its repeats: {cost_pp, noise_pp, within_noise}, cost
    the median saving's negative (a saving is no cost), noise the savings' spread over the repeats."""
    cost = max(0.0, -100 * p["saving"]["median"])
    noise = 100 * (max(p["saving"]["values"]) - min(p["saving"]["values"]))
    return {"cost_pp": cost, "noise_pp": noise, "within_noise": cost <= noise}


def checks(points: list[dict], sweep: list[dict]) -> dict:
    """Does the answer hold: regrouping costs no figure time beyond the noise its own repeats show (one-sided:
    `regroup_costly` names each figure that fails), the sweep's savings grow with k, and no figure's spread is
    above MAX_SPREAD_PP?"""
    costly = [f"{p['name']}: regrouping cost {c['cost_pp']:.1f} % > {c['noise_pp']:.1f} pp spread of its repeats"
              for p in points + sweep if not (c := regroup_cost(p))["within_noise"]]
    medians = [p["saving"]["median"] for p in sorted(sweep, key=lambda p: p["nic_to_uplink"])]
    monotonic = all(b > a for a, b in zip(medians, medians[1:], strict=False))
    worst = max((p["saving"]["spread_pp"] for p in points + sweep), default=0.0)
    out = {
        "regroup_within_noise": not costly,
        "regroup_costly": costly,
        "sweep_monotonic": monotonic,
        "max_spread_pp": worst,
        "spread_ok": worst <= MAX_SPREAD_PP,
    }
    by_case = {p["case"]: p for p in points}
    if "b" in by_case:
        out["case_b_saving_pp_vs_paper"] = 100 * (by_case["b"]["saving"]["median"] - PAPER["b"]["reduction"])
    if "a" in by_case:
        out["case_a_saving_pp_vs_paper"] = 100 * (by_case["a"]["saving"]["median"] - PAPER["a"]["reduction"])
    return out


def fabric_checks(record: dict) -> dict:
    """Did the fabric drop nothing and retransmit little, in every calibration and run? Each problem
    named with the run (its tag) and the port, socket or job's NIC."""
    problems = [f"calibration {i + 1}: {p}" for i, c in enumerate(record["calibration"]["runs"])
                for p in c.get("fabric_counters", {}).get("problems", [])]
    problems += [f"{r['tag']}: {p}" for r in record["runs"] for p in r.get("fabric_counters", {}).get("problems", [])]

    def by_port(runs: list[dict]) -> dict[str, int]:  # every counter that dropped, summed over `runs`
        out: dict[str, int] = {}
        for c in runs:
            for where, n in c.get("fabric_counters", {}).get("drops", {}).items():
                if n:
                    out[where] = out.get(where, 0) + n
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    # a run whose counters could not be read has no drop figure: an error, never counted as zero
    errors = [f"calibration {i + 1}: {e}" for i, c in enumerate(record["calibration"]["runs"])
              for e in c.get("fabric_counters", {}).get("errors", [])]
    errors += [f"{r['tag']}: {e}" for r in record["runs"] for e in r.get("fabric_counters", {}).get("errors", [])]

    shares = [f"{r['tag']}: {p}" for r in record["runs"]
              for p in r.get("fabric_counters", {}).get("share_problems", [])]
    per_run = [(r["tag"], r.get("fabric_counters", {}).get("uplink_shares") or {"flows": {}}) for r in record["runs"]]
    unjudged = [f"{tag}: {k}" for tag, s in per_run for k in sharecheck.unjudged_flows(s)]
    return {"fabric": record.get("fabric"), "fabric_clean": not problems and not errors, "fabric_problems": problems,
            "fabric_read_errors": errors,
            "uplink_shares_maxmin": not shares, "uplink_share_problems": shares,
            "uplink_flows_judged": sum(len(s["flows"]) for _, s in per_run) - len(unjudged),
            "uplink_flows_unjudged": unjudged,
            "fabric_drops": by_port(record["runs"]), "fabric_calibration_drops": by_port(record["calibration"]["runs"])}


def passed(record: dict) -> bool:
    """Every self-check of the record: regrouping costs nothing beyond noise (records made before that check:
    signs kept), spread, the sweep (if any), a clean fabric and max-min shares of the uplinks."""
    c = record["checks"]
    return bool(c.get("regroup_within_noise", c.get("signs_kept")) and c["spread_ok"]
                and (c["sweep_monotonic"] or not record["sweep"])
                and c.get("fabric_clean", True) and c.get("uplink_shares_maxmin", True))


# --- output --------------------------------------------------------------------------------
def _pct(p: dict) -> str:
    sv = p["saving"]
    return f"{100 * sv['median']:.1f} % (spread {sv['spread_pp']:.1f} pp)"


def table(record: dict) -> str:
    rows = [
        "| case | job of concern | fragmented | regrouped | completion time saved "
        f"| {COMPUTE_FRACTION} | paper (completion, saved, measured GPU utilization) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in record["points"]:
        f, g, paper = p["fixed"], p["regroup"], PAPER[p["case"]]
        red = CASES[p["case"]].concern
        rows.append(
            f"| ({p['case']}) | {len(red)} GPUs ({','.join(red)}) | {f['completion_rack_s']:.2f} s "
            f"| {g['completion_rack_s']:.2f} s | {_pct(p)} "
            f"| {f['mean_gpu_util']:.2f} → {g['mean_gpu_util']:.2f} ({g['mean_gpu_util'] / f['mean_gpu_util']:.2f}×) "
            f"| {paper['before_s']} s → {paper['after_s']} s, −{100 * paper['reduction']:.1f} %, "
            f"GPU utilization {paper['util']} |"
        )
    out = "\n".join(rows)
    if record["sweep"]:
        out += (
            "\n\nCase (a) against the inter-switch uplink's rate (GPU NIC : uplink):\n\n"
            "| NIC : uplink | uplink | fragmented, mean iteration | regrouped, mean iteration | completion time saved "
            f"| {COMPUTE_FRACTION} |\n| --- | --- | --- | --- | --- | --- |\n"
        )
        out += "\n".join(
            f"| 1:{p['nic_to_uplink']:.3g}{' (fitted)' if p['name'].startswith('fitted') else ''} "
            f"| {p['uplink_gbps']:.3g} Gbit/s | {p['fixed']['mean_iteration_rack_s']:.3f} s "
            f"| {p['regroup']['mean_iteration_rack_s']:.3f} s | {_pct(p)} "
            f"| {p['fixed']['mean_gpu_util']:.2f} → {p['regroup']['mean_gpu_util']:.2f} |"
            for p in record["sweep"]
        )
    return out


def calibration_text(record: dict) -> str:
    runs = [
        Calibration(**{k: v for k, v in r.items() if k not in ("fraction", "ok", "fabric_counters")})
        for r in record["calibration"]["runs"]
    ]
    lines = [c.line() for c in runs]
    if record["calibration"].get("host_too_slow"):
        lines.append("WARNING: the host could not carry the emulated rates; the figures are skewed by the host.")
    return "\n".join(f"- {line}" for line in lines)


def checks_text(record: dict) -> str:
    c = record["checks"]
    lines = [
        f"- regrouping costs no figure time beyond the spread of its {record['settings']['repeats']} repeats: "
        f"{'yes' if c['regroup_within_noise'] else 'NO'}" + "".join(f"\n  - {x}" for x in c["regroup_costly"]),
        f"- largest spread of a figure: {c['max_spread_pp']:.1f} pp (at most {MAX_SPREAD_PP:g}: "
        f"{'yes' if c['spread_ok'] else 'NO'})",
    ]
    if record["sweep"]:
        lines.append(f"- the sweep's savings grow with k: {'yes' if c['sweep_monotonic'] else 'NO'}")
    slow = [(p["name"], d) for p in record["points"] + record["sweep"] for d in p.get("disturbed", [])]
    for name, d in slow:
        idle = "" if d["host_idle_percent"] is None else f"; host CPU idle {d['host_idle_percent']:.0f} %, stolen " \
            f"{d['host_steal_percent']:.1f} %"
        lines.append(f"- {name}: {d['policy']} repeat #{d['repeat'] + 1} was {100 * d['slower_by']:.0f} % slower than "
                     f"its median, in {d['by']} ({d['compute_extra_rack_s']:+.3f} rack s compute, "
                     f"{d['comm_extra_rack_s']:+.3f} communication per iteration){idle}")
    if "uplink_shares_maxmin" in c:
        lines.append(f"- the crossing flows' shares of the uplink within {100 * sharecheck.MAX_SHARE_ERROR:g} % of "
                     f"max-min: {'yes' if c['uplink_shares_maxmin'] else 'NO'}, "
                     f"{len(c['uplink_share_problems'])} flows off (checks.uplink_share_problems)"
                     + (f"; {c['uplink_flows_judged']} judged, {len(c['uplink_flows_unjudged'])} seen in fewer "
                        f"than {sharecheck.MIN_SHARE_WINDOWS} windows and not judged (checks.uplink_flows_unjudged)"
                        if "uplink_flows_judged" in c else ""))
    if "fabric_clean" in c:
        lines.append(
            f"- the {c['fabric']} fabric dropped nothing and every container retransmitted at most "
            f"{100 * counters.MAX_RETRANS:g} % of its segments: {'yes' if c['fabric_clean'] else 'NO'}"
        )
        drops = c.get("fabric_drops", {})
        lines += [f"  - {n} packets dropped at {where} in the jobs' runs" for where, n in list(drops.items())[:10]]
        lines += [f"  - {n} packets dropped at {where} in the calibrations"
                  for where, n in list(c.get("fabric_calibration_drops", {}).items())[:3]]
        errors = c.get("fabric_read_errors", [])
        lines += [f"  - ERROR, drop counters not read (unknown, not zero): {e}" for e in errors[:10]]
        others = [p for p in c["fabric_problems"]
                  if "packets dropped at" not in p and "drop counters not read" not in p]
        lines += [f"  - {p}" for p in others[:10]]
        if len(drops) + len(others) > 20:
            lines.append(f"  - ... and {len(drops) + len(others) - 20} more (in the record, checks.fabric_problems)")
    if "case_a_saving_pp_vs_paper" in c:
        lines.append(
            f"- case (a), to which the uplink was fitted: {c['case_a_saving_pp_vs_paper']:+.1f} pp "
            "from the paper's 73.2 %"
        )
    if "case_b_saving_pp_vs_paper" in c:
        lines.append(
            f"- case (b), predicted by the fitted rack: {c['case_b_saving_pp_vs_paper']:+.1f} pp "
            "from the paper's 62.0 %"
        )
    return "\n".join(lines)
