"""The probe set: fixed inputs the model predicts for, whose outputs, bit for bit, are the model's identity.

Each probe runs the model on inputs committed beside this file (evidence/probe_inputs/) and returns plain data
(dicts, lists, strings, ints and floats, never rounded); evidence/fingerprint.py hashes them. The probes:

- `demo`: both of the paper's cases at the demo's rack and case (a) at every sweep point, each policy, simulated
  as the fidelity test simulates a `make demo` record (simulator/model/fidelity.py `compare`), on a frozen copy of the
  fields the simulator reads from one record, its calibration included; and the lossless fabric's what-if.
- `trace`: the trace check's trace on its 16-GPU rack, each of fixed, regroup and defragment every 30 s, with the
  emulation's lags, as the trace check simulates a replay (simulator/model/tracesim.py; its calibration the demo
  probe's).
- `failures`: a generated rack with server failures under each recovery (swap, checkpoint, scratch).
- `neighbours`: the neighbours' fabrics and collectives (ODDL, TopoOpt-like, SiP-ML-like, PANAMA, SwitchML-like,
  MLTCP) on one workload.
- `scale`: a generated rack of 16,384 GPUs (the large-scale paths: whole all-reduces as one phase, the mean field
  of large components as arrays) under each placement and admission policy, and the paper's rack with every
  component forced to the mean field, with time shifting and a transformer job.

This module imports only the model (the `simulator`, `controller.core` and `profiles` modules that predict) and
the standard library, and each import is looked up under the names the model's modules have had, so that
`python evidence/probes.py` can run against an older commit's tree (evidence/fingerprint.py `--at`).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import sys
from pathlib import Path

INPUTS = Path(__file__).resolve().parent / "probe_inputs"

# each model module under the names it has had, newest first (the first that imports is used): a probe runs on older
# trees too
MODULES = {
    "calibration": ("simulator.model.calibration", "simulator.calibration"),
    "engine": ("simulator.model.engine", "simulator.engine"),
    "failures": ("simulator.model.failures", "simulator.failures"),
    "fidelity": ("simulator.model.fidelity", "simulator.fidelity"),
    "interference": ("simulator.model.interference", "simulator.interference"),
    "lags": ("simulator.model.lags", "simulator.lags"),
    "neighbours": ("simulator.model.neighbours", "simulator.neighbours"),
    "racks": ("simulator.inputs.racks", "simulator.racks"),
    "rack": ("controller.core.rack",),
    "workloads": ("simulator.inputs.workloads", "simulator.workloads"),
    "profiles": ("profiles",),
}


def module(name: str):
    """The model's module `name` (a key of MODULES), under whichever of its names this tree has."""
    errors = []
    for dotted in MODULES[name]:
        try:
            return importlib.import_module(dotted)
        except ModuleNotFoundError as e:
            errors.append(str(e))
    raise ModuleNotFoundError(f"the model's {name} module: {'; '.join(errors)}")


def plain(value):
    """`value` as JSON data that keeps every float exactly (json writes a float's shortest round-trip repr)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float) or hasattr(value, "__float__"):
        f = float(value)
        return f if math.isfinite(f) else repr(f)  # nan, inf: named (JSON has no such number)
    if hasattr(value, "__iter__"):  # the engine's Busy: rows of (from, to, GPU-seconds)
        return [plain(v) for v in value]
    raise TypeError(f"a probe's output holds a {type(value).__name__}, not plain data")


def run_result(out) -> dict:
    """What a simulated run predicts: every job's figures and the run's (not its solver's counters)."""
    return {"jobs": [plain(j) for j in out.jobs], "held": plain(out.held), "busy": plain(out.busy),
            "reconfigurations": out.reconfigurations, "circuits_changed": out.circuits_changed,
            "dark_s": plain(out.dark_s), "frag": plain(out.frag), "failures": out.failures,
            "lost_gpu_s": plain(out.lost_gpu_s), "restart_gpu_s": plain(out.restart_gpu_s)}


def _demo_record() -> dict:
    return json.loads((INPUTS / "demo.json").read_text())


def demo() -> dict:
    fidelity, calibration = module("fidelity"), module("calibration")
    record = _demo_record()
    rows, cal = fidelity.compare(record)
    what_if, _ = fidelity.compare(record, case="a", sharing="held")
    return {"calibration": plain(cal),
            "points": [[p.case, p.label, p.uplink_gbps, p.policy, p.simulated_s] for p in rows],
            "held what-if": [[p.label, p.policy, p.simulated_s] for p in what_if],
            "provisional": plain(calibration.from_record({"fabric": "droptail"}))}


def _trace_simulator(cal):
    """simulate(rack_file, rows, policy, defrag_s, with_lags, one_step) as the trace check runs it, calibrated by
    `cal`: simulator/model/tracesim.py's, or in older trees tracecheck's with its record lookup answered by `cal`."""
    tracesim = None
    for name in ("simulator.model.tracesim", "simulator.tracesim"):
        try:
            tracesim = importlib.import_module(name)
            break
        except ModuleNotFoundError:
            continue
    if tracesim is None:
        tracecheck = importlib.import_module("simulator.tracecheck")
        tracecheck.calibration_for = lambda fabric="lossless": (cal, "the probe's")
        return tracecheck.simulate
    return lambda rack_file, rows, policy, defrag_s, *more: tracesim.simulate(rack_file, rows, policy, defrag_s, cal,
                                                                              *more)


def trace() -> dict:
    """As the trace check simulates a replay, its calibration the demo probe's record's."""
    calibration, workloads = module("calibration"), module("workloads")
    simulate = _trace_simulator(calibration.from_record(_demo_record()))
    jobs = sorted(workloads.read_trace(INPUTS / "trace16.csv"), key=lambda j: j.arrival_s)
    rows = [{"arrival_s": j.arrival_s, "gpus": j.gpus, "model": j.model, "iterations": j.iterations} for j in jobs]
    out = {}
    for policy, defrag_s in (("fixed", 300.0), ("regroup", 300.0), ("defrag", 30.0)):
        sim, changes = simulate(INPUTS / "trace16.yaml", rows, policy, defrag_s)
        out[policy] = {"rows": plain(sim), "circuits_changed": changes}
    sim, changes = simulate(INPUTS / "trace16.yaml", rows, "regroup", 300.0, False, True)
    out["regroup, no lags, one step"] = {"rows": plain(sim), "circuits_changed": changes}
    return out


def _synthetic(rack, jobs: int, seed: int, load: float):
    workloads, profiles = module("workloads"), module("profiles")
    common = sorted({g.model for g in rack.gpus.values()})[0]
    nic = min(g.nic.rate_gbps for g in rack.gpus.values()) * 1e9 / 8
    per = {m: profiles.compute_seconds(m, common) + 2 * 7 / 8 * profiles.WORKLOADS[m].gradient_bytes / nic
           for m in profiles.WORKLOADS}
    return workloads.synthetic(jobs, seed, len(rack.gpus), per, load)


def failures() -> dict:
    engine, failures, racks = module("engine"), module("failures"), module("racks")
    rack = racks.generate(racks.RackOptions(256, gpus_per_switch=32, oversubscription=8.0, spare=1.5))
    jobs = _synthetic(rack, 60, 7, 0.9)
    f = failures.Failures("swap", mtbf_s=0.5 * 3600.0, repair_s=600.0, checkpoint_s=300.0, seed=3)
    out = {}
    for name in ("fixed", "regroup"):
        for recovery in failures.RECOVERIES:
            policy = engine.with_recovery(engine.policies(300.0)[name], recovery)
            result = engine.Run(rack, jobs, policy, engine.Options(failures=f)).run()
            out[policy.name] = run_result(result)
    return out


def neighbours() -> dict:
    engine, neighbours, racks = module("engine"), module("neighbours"), module("racks")
    rack = racks.generate(racks.RackOptions(64, gpus_per_switch=16, oversubscription=4.0))
    jobs = _synthetic(rack, 40, 11, 1.0)
    out = {}
    for name, policy in neighbours.policies(neighbours.Params()).items():
        result = neighbours.run_class(policy)(rack, jobs, policy, engine.Options()).run()
        out[name] = run_result(result)
    return out


def scale() -> dict:
    engine, racks, rack_mod, interference = module("engine"), module("racks"), module("rack"), module("interference")
    workloads = module("workloads")
    out = {}
    table = engine.policies(120.0)
    # 16,384 GPUs: the generated rack at scale, whole all-reduces as one phase
    rack = racks.generate(racks.RackOptions(16384, gpus_per_switch=64, oversubscription=16.0))
    jobs = _synthetic(rack, 200, 5, 1.2)
    for name in ("fixed", "regroup"):
        out[f"16384 GPUs, {name}"] = run_result(engine.Run(rack, jobs, table[name], engine.Options()).run())
    # 1,024 GPUs kept busy: rings share uplinks, in components stepped through, or (small limits) large enough for
    # the mean field, solved as arrays
    rack = racks.generate(racks.RackOptions(1024, gpus_per_switch=32, oversubscription=16.0, spare=1.5))
    jobs = _synthetic(rack, 250, 9, 1.6)
    for name in ("fixed", "regroup", "defrag", "timeshift", "ideal"):
        out[f"1024 GPUs, {name}"] = run_result(engine.Run(rack, jobs, table[name], engine.Options()).run())
    for scheduler in ("backfill", "sjf", "las"):
        policy = engine.with_scheduler(table["regroup"], scheduler)
        out[f"1024 GPUs, {policy.name}"] = run_result(engine.Run(rack, jobs, policy, engine.Options()).run())
    limits = interference.Limits(rings=2, round_events=32, window=10)
    for name in ("fixed", "timeshift"):
        options = engine.Options(limits=limits)
        out[f"1024 GPUs, {name}, small limits"] = run_result(engine.Run(rack, jobs, table[name], options).run())
    # the paper's rack: every component forced to the mean field or stepped through, a transformer job, NVLink
    paper = rack_mod.load_rack(INPUTS / "paper-testbed.yaml")
    small = [workloads.JobSpec("t1", 0.0, 4, "transformer:1e9", 30), *_synthetic(paper, 12, 2, 1.5)]
    for name in ("regroup", "timeshift"):
        for force in ("mean", "detail"):
            options = engine.Options(force=force, limits=interference.Limits(),
                                     nvlink_gbps=300.0 if force == "mean" else 0.0)
            out[f"paper rack, {name}, {force}"] = run_result(engine.Run(paper, small, table[name], options).run())
    return out


PROBES = {"demo": demo, "trace": trace, "failures": failures, "neighbours": neighbours, "scale": scale}


def run(names=None) -> dict:
    """Every probe's outputs (or those of `names`), by name."""
    return {name: PROBES[name]() for name in (names or PROBES)}


def model_files() -> list[str]:
    """The files of the model's modules this process imported (where the model came from)."""
    return sorted(m.__file__ for name, m in list(sys.modules.items())
                  if name.split(".")[0] in ("simulator", "profiles") or name.startswith("controller.core.")
                  if getattr(m, "__file__", None))


def main(argv: list[str] | None = None) -> int:
    """`python evidence/probes.py [--json-with-files] [NAME...]`: the probes' outputs as JSON on stdout, run on the
    model this interpreter imports (the tree first on its path); --json-with-files: {outputs, files}, files being
    where the model's modules were imported from."""
    args = list(sys.argv[1:] if argv is None else argv)
    with_files = "--json-with-files" in args
    names = [a for a in args if a != "--json-with-files"] or None
    unknown = [n for n in names or () if n not in PROBES]
    if unknown:
        print(f"probes: unknown probe {', '.join(unknown)} (known: {', '.join(PROBES)})", file=sys.stderr)
        return 2
    outputs = run(names)
    json.dump({"outputs": outputs, "files": model_files()} if with_files else outputs, sys.stdout, sort_keys=True,
              allow_nan=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
