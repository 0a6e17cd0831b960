"""Placement: which GPUs a job gets, under which aggregator switches, and the circuits that put them there.

Policies:
- ``fixed``: the server-centric baseline. Today's cabling is kept (no circuit changes), so a job's
  GPUs may sit under several switches; among the free GPUs with circuits it takes those under
  the fewest switches.
- ``regroup``: the paper's idea. The OCS brings the job's GPUs under one aggregator switch with
  the fewest circuit changes, never touching a circuit of another job; when no switch has room,
  the fewest switches, and the plan says so.

GPU models: a job may name one (``gpu_model``) and then gets only that model. Otherwise it gets
GPUs of one model when one model has enough free (fewest switches first, then the model that is
fastest for its workload, then fewest circuit changes); if none has, the mixed set whose slowest
GPU is fastest (a synchronous ring runs at its slowest GPU's pace), again under the fewest
switches. `Plan.note` says what the job got and why.

API (pure: nothing here does I/O or keeps global state; the simulator and the controller call it):

    occ = Occupancy(rack, circuits, holders)          # controller.core.occupancy; incremental
    p = plan(occ, Request(gpus=8, policy="regroup", gpu_model=None, workload="vgg16"))
    p.gpus, p.switches, p.remove, p.add, p.note      # a diff, not a whole circuit map
    occ.commit("job-1", p)                           # = occ.apply(p.remove, p.add); occ.hold("job-1", p.gpus)
    occ.release("job-1")                             # the job ended; its circuits stay
    plan_regroup(occ, gpus_of_a_running_job)         # one job; see controller.core.defrag for all
    fragmentation(occ)                               # the largest job one switch could take now

`plan` raises `InvalidRequest` (bad input, e.g. an unknown model: HTTP 400), `NoRoomNow` (not
enough free GPUs or downlinks now: the job may wait), or `PlacementError` (never placeable as
asked). `occ` is left exactly as it was. Cost: O(switches x OCS groups + job size) per plan.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from controller.core.circuits import Changes, Circuit, CircuitMap
from controller.core.occupancy import Occupancy
from controller.core.placing import _place
from controller.core.pools import (  # noqa: F401 (the errors are placement's names too)
    _PLANNING,
    InvalidRequest,
    NoRoomNow,
    PlacementError,
    _cost,
    _Models,
    _Named,
)
from profiles import GPU_MODELS, WORKLOADS, compute_seconds

POLICIES = ("fixed", "regroup")
@dataclass(frozen=True)
class Request:
    gpus: int | tuple[str, ...]  # how many, or which (rank order is decided by the plan)
    policy: str = "regroup"
    gpu_model: str | None = None
    workload: str = "vgg16"  # for ranking GPU models by speed (profiles/__init__.py)
    switches: tuple[str, ...] | None = None  # all the GPUs under one of these switches (None: any placement)


@dataclass(frozen=True)
class Plan(Changes):
    gpus: tuple[str, ...]  # in rank order: switch by switch, so a ring crosses switches as little as it can
    switches: tuple[str, ...]  # aggregator switches the job's GPUs end under
    remove: frozenset[Circuit] = frozenset()
    add: frozenset[Circuit] = frozenset()
    note: str = ""

    def target(self, circuits: CircuitMap) -> CircuitMap:
        """The circuit map after this plan, from the map it was made on."""
        return circuits.apply(self.diff)


def seconds_per_iteration(workload: str, model: str) -> float:
    """Compute time of one iteration of `workload` on `model` (peak FP32 ranking for unknown workloads)."""
    if workload in WORKLOADS:
        return compute_seconds(workload, model)
    return 1.0 / GPU_MODELS[model].fp32_tflops


def _plan_from(
    occ: Occupancy,
    ids: list[int],
    used: list[int],
    original: dict[int, int],
    note: str,
    order: Sequence[int] | None = None,
) -> Plan:
    """The Plan of a placement made inside `occ.tentative()` (read before the rollback)."""
    ix = occ.ix
    remove, add = set(), set()
    for gi, before in original.items():
        gp = ix.gpu_port[gi]
        after = occ.partner[gp]
        if before != after:
            if before >= 0:
                remove.add(ix.circuit(gp, before))
            if after >= 0:
                add.add(ix.circuit(gp, after))
    switches = sorted(set(used) | {occ.loc[gi] for gi in ids if occ.loc[gi] >= 0})
    if order is None:
        order = sorted(ids, key=lambda gi: (occ.loc[gi], gi))
    return Plan(
        tuple(ix.gpus[gi] for gi in order),
        tuple(ix.switches[w] for w in switches),
        frozenset(remove),
        frozenset(add),
        note,
    )


# --- the entry points -----------------------------------------------------------------------------
def plan(occ: Occupancy, req: Request, job: str | None = None, noted: bool = True) -> Plan:
    """Choose GPUs for `req` (or take the named ones) and the circuits that place them. `job`: also commit the plan
    to `occ` for that job, as `occ.commit(job, plan)` after it would (the planner's own changes kept where they are
    the plan's, not undone and made again); `occ` is unchanged when it raises. `noted` False: a count's plan comes
    without its note (words no caller of the simulator reads), the same plan otherwise."""
    if req.policy not in POLICIES:
        raise InvalidRequest(f"unknown policy {req.policy!r} ({', '.join(POLICIES)})", "policy")
    if req.gpu_model is not None and req.gpu_model not in occ.ix.model_id:
        here = ", ".join(occ.ix.models)
        what = "no" if req.gpu_model in GPU_MODELS else "unknown GPU model"
        raise InvalidRequest(
            f"{what} {req.gpu_model!r}{' GPUs' if what == 'no' else ''} on rack {occ.rack.name} (models here: {here})",
            "gpu_model",
        )
    if isinstance(req.gpus, int):
        return _plan_count(occ, req, req.gpus, job, noted)
    p = _plan_named(occ, req, req.gpus)
    if job is not None:
        occ.commit(job, p)
    return p


def _plan_named(occ: Occupancy, req: Request, names: tuple[str, ...]) -> Plan:
    ix = occ.ix
    unknown = [g for g in names if g not in ix.gpu_id]
    if unknown:
        raise InvalidRequest(f"unknown GPU {', '.join(unknown)} (rack {occ.rack.name} has {', '.join(ix.gpus)})")
    if len(set(names)) != len(names):
        raise InvalidRequest("a GPU is named twice")
    ids = [ix.gpu_id[g] for g in names]
    if req.gpu_model is not None:
        other = [
            f"{ix.gpus[gi]} is a {ix.models[ix.gpu_model[gi]]}"
            for gi in ids
            if ix.models[ix.gpu_model[gi]] != req.gpu_model
        ]
        if other:
            # well-formed, but this rack cannot place it, ever: like more GPUs of a model than it has (409)
            raise PlacementError(f"{', '.join(other)}, not {req.gpu_model}", "gpu_model")
    held = [f"{ix.gpus[gi]} is held by {occ.holder[gi]}" for gi in ids if occ.holder[gi] is not None]
    if held:
        raise NoRoomNow(", ".join(held))
    if req.policy == "fixed":
        loose = [ix.gpus[gi] for gi in ids if occ.loc[gi] < 0]
        if loose:
            raise PlacementError(
                f"{', '.join(loose)} has no circuit to a switch; the fixed policy keeps the cabling "
                "as it is (use policy 'regroup', or set circuits first)"
            )
        under = {occ.loc[gi] for gi in ids}
        only = _only(occ, req)
        if only is not None and not (len(under) == 1 and under <= set(only)):
            raise NoRoomNow(f"the fixed policy keeps them under {len(under)} switch(es), not all under one of "
                            f"{', '.join(req.switches or ())}")
        return _plan_from(occ, ids, [], {}, _switch_note(occ, ids, len(under), 0))
    original: dict[int, int] = {}
    with occ.tentative():
        placed, used = _place(occ, _Named(occ, ids), len(ids), False, original, _only(occ, req))
        p = _plan_from(occ, placed, used, original, "")
    return _with_note(p, _switch_note(occ, ids, len(p.switches), p.changes))


def _only(occ: Occupancy, req: Request) -> list[int] | None:
    """The switch ids a request confines its GPUs to (all under one of them), None if it does not."""
    if req.switches is None:
        return None
    return [occ.ix.switches.index(w) for w in req.switches if w in occ.ix.switches]


def _plan_count(occ: Occupancy, req: Request, n: int, job: str | None = None, noted: bool = True) -> Plan:
    ix = occ.ix
    if n < 1:
        raise InvalidRequest("at least 1 GPU")
    fixed = req.policy == "fixed"
    total = len(ix.gpus) if req.gpu_model is None else ix.model_count[ix.model_id[req.gpu_model]]
    if n > total:
        what = "GPUs" if req.gpu_model is None else f"x {req.gpu_model}"
        raise PlacementError(f"{n} {what} asked for, the rack has {total}")
    free = _free(occ, fixed)
    speed = {m: seconds_per_iteration(req.workload, ix.models[m]) for m in range(len(ix.models))}
    wired = " with circuits" if fixed else ""
    if req.gpu_model is not None:
        m = ix.model_id[req.gpu_model]
        if free[m] < n:
            raise NoRoomNow(f"{n} x {req.gpu_model} asked for, {free[m]} free{wired} (free: {_free_text(ix, free)})")
        candidates = [[m]]
    else:
        candidates = [[m] for m in sorted(range(len(free)), key=lambda m: speed[m]) if free[m] >= n]
        if not candidates:
            if sum(free) < n:
                raise NoRoomNow(f"{n} GPUs asked for, {sum(free)} free{wired} (free: {_free_text(ix, free)})")
            candidates = [_fastest_mix(free, speed, n)]
    best, kept = None, False
    for models in candidates:
        original: dict[int, int] = {}
        try:
            with occ.tentative():
                placed, used = _place(occ, _Models(occ, models, not fixed), n, fixed, original, _only(occ, req))
                p = _plan_from(occ, placed, used, original, "")
                # a pool of one model places only that model's GPUs: the max over them is its speed
                slowest = speed[models[0]] if len(models) == 1 else max(speed[ix.gpu_model[gi]] for gi in placed)
                key = (len(p.switches), slowest, p.changes)
                last = key[:2] == (1, min(speed.values())) or models is candidates[-1]
                if job is not None and last and (best is None or key < best[0]):  # the plan: committed as it is
                    occ.keep()
                    occ.take_over(_PLANNING, job, p.gpus)
                    kept = True
        except NoRoomNow as e:
            error = e
            continue
        if best is None or key < best[0]:
            best = (key, p, models)
        if key[:2] == (1, min(speed.values())):
            break  # one switch and the fastest model: no later candidate can beat it
    if best is None:
        raise error
    _, p, models = best
    if job is not None and not kept:
        occ.commit(job, p)
    if not noted:
        return p
    return _with_note(p, _count_note(occ, req, p, models, _free_text(ix, free), len(candidates) > 1, speed))


def _free_text(ix, free: list[int]) -> str:
    return ", ".join(f"{ix.models[m]} {k}" for m, k in enumerate(free))


def _free(occ: Occupancy, fixed: bool) -> list[int]:
    if not fixed:
        return list(occ.free_model)
    return occ.n_wired.sum(axis=0).tolist()


def _fastest_mix(free: list[int], speed: dict[int, float], n: int) -> list[int]:
    """The models of the fastest GPUs that add up to `n`: every set drawn from them has the fastest slowest GPU."""
    models, have = [], 0
    for m in sorted(range(len(free)), key=lambda m: speed[m]):
        if free[m]:
            models.append(m)
            have += free[m]
            if have >= n:
                break
    limit = speed[models[-1]]
    return [m for m in range(len(free)) if free[m] and speed[m] <= limit]


def _with_note(p: Plan, note: str) -> Plan:
    return Plan(p.gpus, p.switches, p.remove, p.add, note)


def _switch_note(occ: Occupancy, ids: list[int], switches: int, changes: int) -> str:
    if switches > 1:
        return (
            f"no single aggregator switch has room for {len(ids)} GPUs; "
            f"spread over {switches} ({changes} circuit changes)"
        )
    return f"under one switch ({changes} circuit changes)"


def _count_note(
    occ: Occupancy, req: Request, p: Plan, models: list[int], free_text: str, choice: bool, speed: dict[int, float]
) -> str:
    ix = occ.ix
    counts: dict[str, int] = {}
    for g in p.gpus:
        model = ix.models[ix.gpu_model[ix.gpu_id[g]]]
        counts[model] = counts.get(model, 0) + 1
    got = " + ".join(f"{k} x {m}" for m, k in counts.items())
    slowest = max(counts, key=lambda m: speed[ix.model_id[m]])
    pace = f"{speed[ix.model_id[slowest]]:.3f} s of compute per iteration of {req.workload} on {slowest}"
    if req.gpu_model is not None:
        why = f"gpu_model {req.gpu_model} asked for"
    elif len(counts) > 1:
        why = f"no model has {len(p.gpus)} free (free: {free_text}); this mix has the fastest slowest GPU ({pace})"
    elif choice:
        why = f"one model; of the models with {len(p.gpus)} free, the fewest switches, then fastest ({pace})"
    else:
        why = f"one model ({pace})"
    return f"{got}: {why}; {where_note(p)}"


def where_note(p: Plan) -> str:
    """The end of a placement's note: where its GPUs are and how many circuits that changes."""
    where = (
        f"under {p.switches[0]}"
        if len(p.switches) == 1
        else f"no single aggregator switch has room for {len(p.gpus)} GPUs; spread over {len(p.switches)}: "
        f"{', '.join(p.switches)}"
    )
    return f"{where} ({p.changes} circuit changes)"


def restated(admitted: Plan, applied: Plan) -> str:
    """The admission's note for the placement that stands. A job is admitted with one plan and placed with another,
    made again under the reconfiguration lock from the circuits as they are then: the GPUs and why they were chosen
    stay, where they are and what it changed come from the plan applied."""
    tail = where_note(admitted)
    if admitted.note.endswith(tail):
        return admitted.note[: -len(tail)] + where_note(applied)
    return applied.note


def plan_regroup(occ: Occupancy, gpus: Sequence[str]) -> Plan:
    """Bring a running job's GPUs (held in `occ`, rank order kept) under the fewest switches with the
    fewest changes. If the switch count would not fall, the plan changes nothing and says so."""
    ix = occ.ix
    ids = [ix.gpu_id[g] for g in gpus]
    before = {occ.loc[gi] for gi in ids}
    original: dict[int, int] = {}
    with occ.tentative():
        placed, used = _place(occ, _Named(occ, ids), len(ids), False, original)
        p = _plan_from(occ, placed, used, original, "", order=ids)
    now = tuple(ix.switches[w] for w in sorted(w for w in before if w >= 0))
    if -1 not in before and len(p.switches) >= len(before):
        note = "already under one switch" if len(before) == 1 else f"cannot fall below {len(before)} switches"
        return Plan(tuple(gpus), now, note=note)
    return _with_note(p, _switch_note(occ, ids, len(p.switches), p.changes))


def fragmentation(occ: Occupancy) -> dict:
    """The largest job (any model, and per model) that one switch could take now with the regroup policy."""
    ix = occ.ix
    big = 10**9

    def largest(models: list[int]) -> int:
        pool = _Models(occ, models)
        return max((_cost(big, *pool.totals(occ, w, False))[0] for w in range(len(ix.switches))), default=0)

    return {
        "largest_job_one_switch": largest(list(range(len(ix.models)))),
        "largest_by_model": {m: largest([i]) for i, m in enumerate(ix.models)},
        "free_gpus": sum(occ.free_model),
        "free_by_model": occ.free_by_model(),
    }
