"""How a trace replayed on the emulated rack is simulated: the same jobs, in trace order, through the engine on the
same rack file, with the network calibrated to the emulation and the emulation's lags (simulator/model/lags.py) charged.
The trace check (evidence/tracecheck.py) sets these rows beside a replay record's.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from controller.core.rack import Rack, load_rack
from simulator.inputs.workloads import JobSpec
from simulator.model import lags
from simulator.model.engine import Options, Run, policies, with_scheduler


def simulate(rack_file: Path, trace: list[dict], policy: str, defrag_s: float, cal, with_lags: bool = True,
             one_step: bool = False, scheduler: str = "fifo", host: float = 1.0,
             ensemble: bool = True) -> tuple[list[dict], int]:
    """The trace's jobs (dicts of arrival_s, gpus, model, iterations; trace order) through the engine on
    `rack_file` under `policy`, the network calibrated by `cal` (a simulator.model.calibration.Calibration): (comparison
    rows, circuits changed). The emulation's lags are charged unless `with_lags` is false (the model before them,
    for comparison); `one_step`: every ring step costs STEP_S whatever its chunk (the model before the small
    chunks' step, simulator/model/calibration.py); `scheduler`: the queue's discipline (controller/core/admission.py),
    each job's estimate the simulator's own; `host`: how much slower than the fit's the emulating host was (the
    replay's probe, lags.host_factor), every lag charged that many times; `ensemble` (with the lags): each row's
    times the mean over lags.DRAWS runs, each job's start lags drawn from the emulation's spread around them
    (lags.draws), and the circuits changed their mean, rounded; without, one run at the lags as fitted."""
    rack = load_rack(rack_file)  # parsed once; each run gets its own copy
    if not with_lags or not ensemble:
        return _once(rack, trace, policy, defrag_s, cal, with_lags, one_step, scheduler, host, None)
    runs = [_once(copy.deepcopy(rack), trace, policy, defrag_s, cal, with_lags, one_step, scheduler, host, j)
            for j in lags.draws(len(trace))]
    rows = []
    for i, first in enumerate(runs[0][0]):
        each = [rs[i] for rs, _ in runs]
        row = {"index": i, "arrival_s": first["arrival_s"]}
        for k in ("admit_s", "start_s", "end_s"):
            row[k] = None if any(r[k] is None for r in each) else sum(r[k] for r in each) / len(each)
        rows.append(row)
    return rows, round(sum(c for _, c in runs) / len(runs))


def _once(rack: Rack, trace: list[dict], policy: str, defrag_s: float, cal, with_lags: bool, one_step: bool,
          scheduler: str, host: float, jitter) -> tuple[list[dict], int]:
    jobs, run = _run(rack, trace, policy, defrag_s, cal, with_lags, one_step, scheduler, host, jitter)
    out = run.run()
    by_id = {j.id: j for j in out.jobs}
    rows = []
    for i, spec in enumerate(jobs):
        r = by_id[spec.id]
        rows.append({"index": i, "arrival_s": r.arrival_s, "admit_s": r.placed_s, "start_s": r.started_s,
                     "end_s": r.end_s if r.end_s >= 0 and not r.failed else None})
    return rows, out.circuits_changed


def estimates(rack_file: Path, trace: list[dict], cal, with_lags: bool = True, one_step: bool = False) -> list[float]:
    """Each of the trace's jobs' run time (rack s) as the simulator's queue disciplines estimate a job that waits
    (simulator/model/schedview.py: its iterations at its iteration time alone on the rack's commonest GPU model, the
    network calibrated by `cal`), before any job runs: what a replay under backfill or sjf sends the controller as each
    job's `estimate_s` (times the time dilation), so that the jobs that wait are ordered by the same estimates on
    both sides."""
    _, run = _run(load_rack(rack_file), trace, "fixed", 300.0, cal, with_lags, one_step, "backfill")
    return [run.view.estimate(i) for i in range(len(trace))]


def _run(rack: Rack, trace: list[dict], policy: str, defrag_s: float, cal, with_lags: bool, one_step: bool,
         scheduler: str, host: float = 1.0, jitter=None) -> tuple[list[JobSpec], Run]:
    jobs = [JobSpec(f"j{i + 1}", j["arrival_s"], j["gpus"], j["model"], j["iterations"]) for i, j in enumerate(trace)]
    charged = lags.for_rack(rack.spec.emulation.time_dilation, host) if with_lags else lags.NONE
    net = cal.net(rack)
    if one_step:
        net = dataclasses.replace(net, small_step_latency_s=None)
    run = with_scheduler(policies(defrag_s)[policy], scheduler)
    return jobs, Run(rack, jobs, run, Options(net=net, step_model="exact", lags=charged, jitter=jitter))
