"""Schemathesis hooks for fuzzing a controller that drives a live emulated rack (SCHEMATHESIS_HOOKS).

The jobs that valid POST /jobs bodies submit are made harmless: profile mode with a compute phase
of ten minutes, so their workers start, take their GPUs and then wait, costing no CPU and no
traffic, until the fuzzing is over and the test's cleanup stops them. Everything else the fuzzer
sends goes as generated. Invalid bodies are never touched: they must still be refused.
"""
from __future__ import annotations

import schemathesis
from schemathesis.core.parameters import ParameterLocation

IDLE_COMPUTE_SECONDS = 600


@schemathesis.hook
def before_call(context, case, kwargs):
    if case.method.upper() != "POST" or case.path != "/jobs" or not isinstance(case.body, dict):
        return
    if case.meta is not None and case.meta.is_negative_at(ParameterLocation.BODY):
        return
    workload = case.body.get("workload", {})
    if isinstance(workload, dict):
        case.body["workload"] = {**workload, "mode": "profile", "compute_seconds": IDLE_COMPUTE_SECONDS}
