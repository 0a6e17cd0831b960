"""make report's blocks for in-network aggregation on the rack (docs/neighbour-panama.md; engine.py merges BLOCKS):
every committed record of scripts/bench_aggregate.py --json, one row per record and collective, and of
scripts/aggregate_losses.py --json, one row per record and run."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from evidence.report.bench import ReportError, _prose, _which, bench_records, signed

NAME = "bench_aggregate"


def configs(results: dict) -> list[dict]:
    """A record's configurations: a matrix record's `configs`, or the one of a record made before the matrix (4
    GPUs under one switch, no port counters)."""
    if "configs" in results:
        return results["configs"]
    return [{"n": len(results["gpus"]), "model": results["model"], "placement": "one", "gpus": results["gpus"],
             "under": {results["switch"]: results["gpus"]}, "simulator": results["simulator"],
             "runs": results["runs"], "summary": results["summary"]}]


def _bytes(b: dict | None) -> str:
    """A collective's NIC bytes each way per iteration, in units of S, against its bound."""
    if b is None:
        return "not counted"

    def one(x: dict) -> str:
        spread = "" if x["max"] - x["min"] < 0.005 else f" ({x['min']:.2f}–{x['max']:.2f})"
        return f"{x['median']:.2f}{spread}"

    return f"{one(b['sent_s'])} / {one(b['received_s'])} S (bound {b['expected_s']:.2f} S)"


def _speedup(s: dict) -> str:
    text = (f"{s['all_reduce_speedup']:.2f}× / {s['iteration_speedup']:.2f}× "
            f"({s['predicted_iteration_speedup']:.2f}×)")
    if s.get("bar") is None and "gain_seen" in s:  # 2 GPUs: no gain expected
        text += "; a gain seen" if s["gain_seen"] else "; no gain seen"
    return text


def bench(_records: list, directory: Path | None = None) -> str:
    found = bench_records(NAME, directory)
    if not found:
        return ("No record yet: `python -m scripts.bench_aggregate --matrix --json "
                "results/bench/<UTC>-<commit>-bench_aggregate.json`, with nothing else running, makes one.")
    rows = ["| record | job | placement | collective | runs | all-reduce, median (emulated) | iteration, median (rack) "
            "| simulated iteration | runs against it (min / max) | every sum exact | each NIC's bytes per iteration: "
            "sent / received | speed-up over ring: all-reduce / iteration (simulated) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    failed = []
    for stem, data in found:
        try:
            for cfg in configs(data["results"]):
                s = cfg["summary"]
                where = "; ".join(f"{w}: {', '.join(g)}" for w, g in cfg["under"].items())
                failed += [f"`{stem}` {cfg['n']} × {cfg['model']} {cfg['placement']}: {k.replace('_', ' ')}"
                           for k, v in s["checks"].items() if not v]
                for c in ("ring", "aggregate"):
                    errs = [x["error"] for x in cfg["runs"] if x["collective"] == c]
                    exact = all(x["exact_sums"] for x in cfg["runs"] if x["collective"] == c)
                    rows.append(f"| `{stem}` | {cfg['n']} × {cfg['model']} | {cfg['placement']} ({where}) | {c} "
                                f"| {s[c]['runs']} | {1000 * s[c]['all_reduce_s']:.0f} ms "
                                f"| {1000 * s[c]['iteration_rack_s']:.0f} ms "
                                f"| {1000 * s[c]['predicted_iteration_rack_s']:.0f} ms "
                                f"| {signed(100 * min(errs))} / {signed(100 * max(errs))} % "
                                f"| {'yes' if exact else 'no'} | {_bytes(s[c].get('bytes'))} "
                                f"| {'' if c == 'ring' else _speedup(s)} |")
        except (KeyError, TypeError, ValueError) as e:
            raise ReportError(f"{stem}-{NAME}.json: not a bench_aggregate record ({e!r} missing or wrong)") from None
    last = found[-1][1]["results"]
    held = "every check holds" if not failed else "failed: " + "; ".join(failed)
    rows += ["", _prose(f"From {_which(found, NAME)}: {last['iterations']} iterations a run (the first left out), "
                        f"ring and aggregate alternately; the simulator: {configs(last)[-1]['simulator']}; {held}.")]
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
