"""Case (b) fragmented, measured: why the simulator is 5-7 % fast there in every record of the current model.

The model runs a ring's all-reduce as one phase that every rank enters and leaves together (simulator/model/rings.py:
each step waits for the slowest rank, and the next iteration starts for all ranks at once). The demo records each
rank's own iterations (`runs[i].job.ranks`: start, compute and communication of every iteration), so the record
shows how far apart the ranks really are. Per fragmented run of a case, from every current-model record:
- the job of concern's mean iteration (rack seconds) and the simulator's (the same `fidelity.simulate`);
- how long its ranks spend computing and communicating at once (compute + communication - iteration: zero where
  every rank enters the all-reduce together, as the model has it);
- the same two for the job beside (`runs[i].beside`), and the simulator's iteration for it (both jobs starting
  together).

`python -m evidence.skew` prints the table; docs/simulator-fidelity.md quotes it. A pure reading of the
committed records: it changes no model (this module is outside simulator/modelhash.MODEL_FILES).
"""
from __future__ import annotations

import argparse
import statistics
import sys

from evidence import records
from simulator.inputs.workloads import paper_case
from simulator.model import calibration, fidelity
from simulator.model.engine import Options, Run, policies


def overlap(summary: dict) -> float:
    """Compute plus communication minus the iteration, rack seconds: how long a ring's ranks spent in the two
    phases at once (a rank already sending while another still computes). Zero where ranks enter together."""
    return summary["mean_compute_rack_s"] + summary["mean_comm_rack_s"] - summary["mean_iteration_rack_s"]


def simulated(record: dict, case: str) -> tuple[float, float]:
    """(job of concern, job beside) mean iteration, rack seconds, fragmented: the job of concern as
    `fidelity.simulate` gives it (mean over start offsets), the job beside as the same model runs it (offset 0)."""
    cal = calibration.from_record(record)
    uplink = min(u["rate_gbps"] for w in record["rack"]["switches"] for u in w.get("uplinks", []))
    point = fidelity.Point(case, f"case ({case})", uplink, "fixed", float("nan"), [])
    rack = fidelity.rack_at(record, uplink)
    settings = record.get("settings", {})
    jobs = paper_case(case, settings.get("iterations", 60), settings.get("model", "vgg16"))
    beside = Run(rack, jobs, policies(300.0)["fixed"], Options(net=cal.net(rack), step_model="exact")).run().jobs[1]
    return fidelity.simulate(record, point, cal), beside.mean_iteration_s


def rows(recs: list[records.Record], case: str = "b") -> list[dict]:
    out = []
    for rec in recs:
        r = rec.data
        sim_concern, sim_beside = simulated(r, case)
        for run in r["runs"]:
            if not run["tag"].startswith(f"case {case} fragmented") or "beside" not in run:
                continue
            out.append({"record": rec.name, "run": run["tag"].removeprefix(f"case {case} "),
                        "concern_s": run["summary"]["mean_iteration_rack_s"], "concern_sim_s": sim_concern,
                        "concern_overlap_s": overlap(run["summary"]),
                        "beside_s": run["beside"]["mean_iteration_rack_s"], "beside_sim_s": sim_beside,
                        "beside_overlap_s": overlap(run["beside"])})
    return out


def table(out: list[dict]) -> str:
    lines = ["| record | run | job of concern: emulated → simulated | its phases overlap | job beside: emulated "
             "→ simulated | its phases overlap |", "| --- | --- | --- | --- | --- | --- |"]
    for x in out:
        lines.append(f"| `{x['record']}` | {x['run']} | {x['concern_s']:.3f} → {x['concern_sim_s']:.3f} s "
                     f"({100 * (x['concern_sim_s'] / x['concern_s'] - 1):+.1f} %) | {x['concern_overlap_s']:.3f} s "
                     f"| {x['beside_s']:.3f} → {x['beside_sim_s']:.3f} s "
                     f"({100 * (x['beside_sim_s'] / x['beside_s'] - 1):+.1f} %) | {x['beside_overlap_s']:.3f} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m evidence.skew", description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="b", choices=("a", "b"))
    args = ap.parse_args(argv)
    recs = records.of_current_model(records.load())
    if not recs:
        print("no committed record of the current model", file=sys.stderr)
        return 2
    out = rows(recs, args.case)
    print(table(out))
    def med(key: str) -> float:
        return 1e3 * statistics.median(x[key] for x in out)

    gap = [1e3 * (x["concern_s"] - x["concern_sim_s"]) for x in out]
    print(f"\n{len(out)} runs (median): the job of concern's simulated iteration {statistics.median(gap):.0f} ms "
          f"short ({min(gap):.0f} to {max(gap):.0f}); its phases overlap {med('concern_overlap_s'):.0f} ms, "
          f"the job beside's {med('beside_overlap_s'):.0f} ms per iteration; the job beside emulated "
          f"{med('beside_s'):.0f} ms, simulated {med('beside_sim_s'):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
