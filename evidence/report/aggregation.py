"""make report's blocks for in-network aggregation on the rack (docs/neighbour-panama.md; engine.py merges BLOCKS):
every committed record of scripts/bench_aggregate.py --json, one row per record and collective, and of
scripts/aggregate_losses.py --json, one row per record and run."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evidence.report.bench import ReportError, _prose, _which, bench_records, signed

NAME = "bench_aggregate"


def bench(_records: list, directory: Path | None = None) -> str:
    found = bench_records(NAME, directory)
    if not found:
        return ("No record yet: `python -m scripts.bench_aggregate --repeats 5 --json "
                "results/bench/<UTC>-<commit>-bench_aggregate.json`, with nothing else running, makes one.")
    rows = ["| record | collective | runs | all-reduce, median (emulated) | iteration, median (rack) "
            "| simulated iteration | runs against it (min / max) | every sum exact | speed-up over ring: "
            "all-reduce / iteration (simulated) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for stem, data in found:
        try:
            r, s = data["results"], data["results"]["summary"]
            for c in ("ring", "aggregate"):
                errs = [x["error"] for x in r["runs"] if x["collective"] == c]
                speed = "" if c == "ring" else (f"{s['all_reduce_speedup']:.2f}× / {s['iteration_speedup']:.2f}× "
                                                f"({s['predicted_iteration_speedup']:.2f}×)")
                rows.append(f"| `{stem}` | {c} | {s[c]['runs']} | {1000 * s[c]['all_reduce_s']:.0f} ms "
                            f"| {1000 * s[c]['iteration_rack_s']:.0f} ms "
                            f"| {1000 * s[c]['predicted_iteration_rack_s']:.0f} ms "
                            f"| {signed(100 * min(errs))} / {signed(100 * max(errs))} % "
                            f"| {'yes' if all(x['exact_sums'] for x in r['runs'] if x['collective'] == c) else 'no'} "
                            f"| {speed} |")
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"{stem}-{NAME}.json: not a bench_aggregate record ({e!r} missing or wrong)") from None
    last = found[-1][1]["results"]
    rows += ["", _prose(f"From {_which(found, NAME)}: {last['model']} on {', '.join(last['gpus'])} under "
                        f"{last['switch']}, {last['iterations']} iterations a run (the first left out), ring and "
                        f"aggregate alternately; the simulator: {last['simulator']}.")]
    return "\n".join(rows)


LOSSES = "aggregate_losses"


def losses(_records: list, directory: Path | None = None) -> str:
    found = bench_records(LOSSES, directory)
    if not found:
        return ("No record yet: `python -m scripts.aggregate_losses --json "
                "results/bench/<UTC>-<commit>-aggregate_losses.json`, with nothing else running, makes one.")
    rows = ["| record | run | collective | against the first ring run: loss, largest relative difference "
            "| gradient norm, largest relative difference | losses identical | replicas equal at the end "
            "| all-reduce, median (emulated) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for stem, data in found:
        try:
            r, s = data["results"], data["results"]["summary"]
            for run in r["runs"]:
                a = run["against_ring"]
                cells = (["(the reference)", "", ""] if a is None else
                         [f"{a['loss_max_relative']:.1e}", f"{a['grad_norm_max_relative']:.1e}",
                          f"{a['loss_identical']} of {a['compared']}"])
                rows.append(f"| `{stem}` | {run['job']} | {run['collective']} | {' | '.join(cells)} "
                            f"| {'yes' if run['exact_sums'] else 'no'} | {1000 * run['all_reduce_s']:.0f} ms |")
            held = "every check holds" if all(s["checks"].values()) else "failed: " + ", ".join(
                k.replace("_", " ") for k, v in s["checks"].items() if not v)
            w = r["workload"]
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"{stem}-{LOSSES}.json: not an aggregate_losses record ({e!r} missing or wrong)") \
                from None
    rows += ["", _prose(f"From {_which(found, LOSSES)}: {r['model']}, {w['iterations']} iterations of batch "
                        f"{w['batch']} per rank on {', '.join(r['gpus'])} under {r['switch']}, in the order "
                        f"{', '.join(r['order'])}; every rank's loss and gradient norm at every iteration compared "
                        f"with the first ring run's; the bar {s['tolerance']:g} relative: {held}.")]
    return "\n".join(rows)


BLOCKS: dict[str, Callable[[list], str]] = {"aggregate-bench": bench, "aggregate-losses": losses}
