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

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

from controller.core.circuits import Changes, Circuit, CircuitMap
from controller.core.occupancy import Occupancy
from profiles import GPU_MODELS, WORKLOADS, compute_seconds

POLICIES = ("fixed", "regroup")
_PLANNING = "~planning"  # holder of GPUs a plan has placed, inside a tentative change


class PlacementError(ValueError):
    """No placement exists for the request; the message says why and `field` names the request's part."""

    def __init__(self, message: str, field: str = "gpus"):
        super().__init__(message)
        self.field = field


class InvalidRequest(PlacementError):
    """The request itself is wrong (an unknown policy, model or GPU, a GPU named twice)."""


class NoRoomNow(PlacementError):
    """Not enough free GPUs or switch downlinks now; the request may succeed when jobs end."""


@dataclass(frozen=True)
class Request:
    gpus: int | tuple[str, ...]  # how many, or which (rank order is decided by the plan)
    policy: str = "regroup"
    gpu_model: str | None = None
    workload: str = "vgg16"  # for ranking GPU models by speed (profiles/__init__.py)


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


# --- pools: the GPUs one placement step may choose from ---------------------------------------
# A placement step puts GPUs of a pool under one switch w. Per (OCS, rate) group g: "stayers" are
# pool GPUs already under w (no change); "movers" are loose (1 change: a new circuit) or under
# another switch (2: cut and new); a mover takes an empty downlink of w (no extra change) or one
# whose circuit goes to an idle GPU outside the pool (1 more: cut it). Pairing the cheapest movers
# with the cheapest downlinks is optimal within a group and its marginal costs (1, 2 or 3) only
# rise, so taking the cost tiers in order across groups gives the fewest changes.
def _split(u: int, c: int, e: int, i: int) -> tuple[int, int, int]:
    """Movers of one group at marginal cost 1, 2 and 3: `u` loose and `c` wired movers, `e` empty and `i` idle
    downlinks."""
    n = u + c if u + c < e + i else e + i
    if n <= 0:
        return 0, 0, 0
    n1 = u if u < e else e
    if n1 > n:
        n1 = n
    hi = u if u > e else e
    n3 = n - hi if n > hi else 0
    return n1, n - n1 - n3, n3


class _Named:
    """Given GPUs, all of which must be placed."""

    fixed_set = True

    def __init__(self, occ: Occupancy, ids: Sequence[int]):
        ix = occ.ix
        self.ids = set(ids)
        ng = len(ix.groups)
        self.loose: dict[int, list[int]] = {}
        self.wired: dict[int, list[int]] = {}
        self.under: dict[int, dict[int, list[int]]] = {}  # switch -> group -> ids there
        self.idle_under: dict[int, dict[int, int]] = {}  # switch -> group -> idle ones of those
        for gi in sorted(ids):
            g, w = ix.gpu_group[gi], occ.loc[gi]
            if w < 0:
                self.loose.setdefault(g, []).append(gi)
            else:
                self.wired.setdefault(g, []).append(gi)
                self.under.setdefault(w, {}).setdefault(g, []).append(gi)
                if occ.holder[gi] is None:
                    idle = self.idle_under.setdefault(w, {})
                    idle[g] = idle.get(g, 0) + 1
        self.groups = sorted(set(self.loose) | set(self.wired))
        self.n_loose = [len(self.loose.get(g, ())) for g in range(ng)]
        self.n_wired = [len(self.wired.get(g, ())) for g in range(ng)]

    def totals(self, occ: Occupancy, w: int, fixed: bool) -> tuple[int, int, int, int]:
        """(stayers, movers at cost 1, 2, 3) for switch `w`."""
        under, idle_under = self.under.get(w, {}), self.idle_under.get(w, {})
        stay = sum(len(v) for v in under.values())
        if fixed:
            return stay, 0, 0, 0
        empty_w, idle_w = occ.empty[w], occ.idle[w]
        n1 = n2 = n3 = 0
        for g in self.groups:
            s = len(under[g]) if g in under else 0
            a, b, c = _split(
                self.n_loose[g], self.n_wired[g] - s, len(empty_w[g]), len(idle_w[g]) - idle_under.get(g, 0)
            )
            n1, n2, n3 = n1 + a, n2 + b, n3 + c
        return stay, n1, n2, n3

    def rows(self, occ: Occupancy, w: int) -> list[tuple[int, int, int, int]]:
        under, idle_under = self.under.get(w, {}), self.idle_under.get(w, {})
        return [
            (
                g,
                *_split(
                    self.n_loose[g],
                    self.n_wired[g] - len(under.get(g, ())),
                    len(occ.empty[w][g]),
                    len(occ.idle[w][g]) - idle_under.get(g, 0),
                ),
            )
            for g in self.groups
        ]

    def stayers(self, w: int, k: int) -> list[int]:
        return sorted(chain.from_iterable(self.under.get(w, {}).values()))

    def movers(self, g: int, w: int, k: int) -> list[int]:
        loose = self.loose.get(g, [])[:k]
        here = set(self.under.get(w, {}).get(g, ()))
        return loose + [gi for gi in self.wired.get(g, ()) if gi not in here][: k - len(loose)]

    def rest(self, occ: Occupancy, placed: list[int]):
        """The pool without `placed`."""
        done = set(placed)
        return _Named(occ, [gi for gi in self.ids if gi not in done])

    def member(self, gi: int) -> bool:
        return gi in self.ids


class _Models:
    """Any idle GPUs of the given models (`occ`'s free indices)."""

    fixed_set = False

    def __init__(self, occ: Occupancy, models: Sequence[int]):
        self.occ, self.models = occ, list(models)
        ng = len(occ.ix.groups)
        self.n_loose = [sum(len(occ.free_loose[g][m]) for m in self.models) for g in range(ng)]
        self.n_wired = [sum(occ.free_wired[g][m] for m in self.models) for g in range(ng)]
        self.groups = [g for g in range(ng) if self.n_loose[g] or self.n_wired[g]]

    def totals(self, occ: Occupancy, w: int, fixed: bool) -> tuple[int, int, int, int]:
        under, empty_w, idle_w = occ.free_under[w], occ.empty[w], occ.idle[w]
        models, n_loose, n_wired = self.models, self.n_loose, self.n_wired
        stay = n1 = n2 = n3 = 0
        for g in self.groups:
            ug = under[g]
            s = 0
            for m in models:
                s += len(ug[m])
            stay += s
            if fixed:
                continue
            # inline _split (this loop is the planner's hot spot)
            u, c, e, i = n_loose[g], n_wired[g] - s, len(empty_w[g]), len(idle_w[g]) - s
            n = u + c if u + c < e + i else e + i
            if n > 0:
                a = u if u < e else e
                if a > n:
                    a = n
                hi = u if u > e else e
                b = n - hi if n > hi else 0
                n1, n2, n3 = n1 + a, n2 + n - a - b, n3 + b
        return stay, n1, n2, n3

    def rows(self, occ: Occupancy, w: int) -> list[tuple[int, int, int, int]]:
        under = occ.free_under[w]
        rows = []
        for g in self.groups:
            s = sum(len(under[g][m]) for m in self.models)
            rows.append(
                (g, *_split(self.n_loose[g], self.n_wired[g] - s, len(occ.empty[w][g]), len(occ.idle[w][g]) - s))
            )
        return rows

    def stayers(self, w: int, k: int) -> list[int]:
        under = self.occ.free_under[w]
        return heapq.nsmallest(k, chain.from_iterable(under[g][m] for g in self.groups for m in self.models))

    def movers(self, g: int, w: int, k: int) -> list[int]:
        occ = self.occ
        loose = heapq.nsmallest(k, chain.from_iterable(occ.free_loose[g][m] for m in self.models))
        if len(loose) == k:
            return loose
        wired = chain.from_iterable(
            occ.free_under[x][g][m] for x in range(len(occ.ix.switches)) if x != w for m in self.models
        )
        return loose + heapq.nsmallest(k - len(loose), wired)

    def rest(self, occ: Occupancy, placed: list[int]):
        """The pool without `placed` (they are held by the plan now)."""
        for gi in placed:
            occ._hold(gi, _PLANNING)
        return _Models(occ, self.models)

    def member(self, gi: int) -> bool:
        return self.occ.ix.gpu_model[gi] in self.models


def _cost(k: int, stay: int, n1: int, n2: int, n3: int) -> tuple[int, int]:
    """(how many of `k` GPUs one switch takes, circuit changes for them)."""
    k -= stay
    if k <= 0:
        return k + stay, 0
    t1 = k if k < n1 else n1
    k -= t1
    t2 = k if k < n2 else n2
    k -= t2
    t3 = k if k < n3 else n3
    return stay + t1 + t2 + t3, t1 + 2 * t2 + 3 * t3


def _assign(occ: Occupancy, pool, w: int, k: int, original: dict[int, int]) -> list[int]:
    """Put `k` GPUs of `pool` under switch `w`: stayers first, then the cheapest moves."""
    ix = occ.ix
    placed = pool.stayers(w, k)[:k]
    k -= len(placed)
    if k <= 0:
        return placed
    rows = pool.rows(occ, w)
    take = {row[0]: 0 for row in rows}
    for tier in (1, 2, 3):
        for row in rows:
            t = min(k, row[tier])
            take[row[0]] += t
            k -= t
    for g, m in take.items():
        if not m:
            continue
        movers = pool.movers(g, w, m)
        slots = heapq.nsmallest(m, occ.empty[w][g])
        if len(slots) < m:
            idle = (d for d in occ.idle[w][g] if not pool.member(ix.port_gpu[occ.partner[d]]))
            slots += heapq.nsmallest(m - len(slots), idle)
        for gi, d in zip(movers, slots, strict=True):
            original.setdefault(gi, occ.partner[ix.gpu_port[gi]])
            other = occ.partner[d]
            if other >= 0:
                original.setdefault(ix.port_gpu[other], d)
            occ.move(gi, d)
        placed += movers
    return placed


def _place(occ: Occupancy, pool, n: int, fixed: bool, original: dict[int, int]) -> tuple[list[int], list[int]]:
    """Place `n` GPUs of `pool` under the fewest switches (greedy: the switch that takes the most,
    then the fewest changes, then the first); mutates `occ` (callers wrap it in `occ.tentative()`).
    Returns (GPU ids placed, switch ids used)."""
    placed: list[int] = []
    used: list[int] = []
    while len(placed) < n:
        need = n - len(placed)
        best = None
        for w in range(len(occ.ix.switches)):
            if w in used:
                continue
            fits, cost = _cost(need, *pool.totals(occ, w, fixed))
            if fits and (best is None or fits > best[0] or (fits == best[0] and cost < best[1])):
                best = (fits, cost, w)
                if fits == need and cost == 0:
                    break  # nothing beats it
        if best is None:
            raise NoRoomNow(_no_room(occ, pool, need, fixed))
        fits, _, w = best
        ids = _assign(occ, pool, w, fits, original)
        used.append(w)
        placed += ids
        if len(placed) < n:
            pool = pool.rest(occ, ids)
    return placed, used


def _no_room(occ: Occupancy, pool, need: int, fixed: bool) -> str:
    if fixed:
        return f"{need} more free GPUs with circuits are needed (the fixed policy keeps the cabling)"
    if pool.fixed_set:
        names = ", ".join(occ.ix.gpus[gi] for gi in sorted(pool.ids))
        return f"no free downlink can take {names} (every switch port is held by other jobs)"
    return f"no switch has a free downlink for {need} more GPUs (every switch port is held by other jobs)"


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
def plan(occ: Occupancy, req: Request) -> Plan:
    """Choose GPUs for `req` (or take the named ones) and the circuits that place them."""
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
        return _plan_count(occ, req)
    return _plan_named(occ, req)


def _plan_named(occ: Occupancy, req: Request) -> Plan:
    ix = occ.ix
    unknown = [g for g in req.gpus if g not in ix.gpu_id]
    if unknown:
        raise InvalidRequest(f"unknown GPU {', '.join(unknown)} (rack {occ.rack.name} has {', '.join(ix.gpus)})")
    if len(set(req.gpus)) != len(req.gpus):
        raise InvalidRequest("a GPU is named twice")
    ids = [ix.gpu_id[g] for g in req.gpus]
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
        return _plan_from(occ, ids, [], {}, _switch_note(occ, ids, len({occ.loc[gi] for gi in ids}), 0))
    original: dict[int, int] = {}
    with occ.tentative():
        placed, used = _place(occ, _Named(occ, ids), len(ids), False, original)
        p = _plan_from(occ, placed, used, original, "")
    return _with_note(p, _switch_note(occ, ids, len(p.switches), p.changes))


def _plan_count(occ: Occupancy, req: Request) -> Plan:
    ix, n = occ.ix, req.gpus
    if n < 1:
        raise InvalidRequest("at least 1 GPU")
    fixed = req.policy == "fixed"
    total = len(ix.gpus) if req.gpu_model is None else ix.model_count[ix.model_id[req.gpu_model]]
    if n > total:
        what = "GPUs" if req.gpu_model is None else f"x {req.gpu_model}"
        raise PlacementError(f"{n} {what} asked for, the rack has {total}")
    free = _free(occ, fixed)
    speed = {m: seconds_per_iteration(req.workload, ix.models[m]) for m in range(len(ix.models))}
    free_text = ", ".join(f"{ix.models[m]} {k}" for m, k in enumerate(free))
    wired = " with circuits" if fixed else ""
    if req.gpu_model is not None:
        m = ix.model_id[req.gpu_model]
        if free[m] < n:
            raise NoRoomNow(f"{n} x {req.gpu_model} asked for, {free[m]} free{wired} (free: {free_text})")
        candidates = [[m]]
    else:
        candidates = [[m] for m in sorted(range(len(free)), key=speed.get) if free[m] >= n]
        if not candidates:
            if sum(free) < n:
                raise NoRoomNow(f"{n} GPUs asked for, {sum(free)} free{wired} (free: {free_text})")
            candidates = [_fastest_mix(free, speed, n)]
    best = None
    for models in candidates:
        original: dict[int, int] = {}
        try:
            with occ.tentative():
                placed, used = _place(occ, _Models(occ, models), n, fixed, original)
                p = _plan_from(occ, placed, used, original, "")
        except NoRoomNow as e:
            error = e
            continue
        slowest = max(speed[ix.model_id[ix.rack.gpus[g].model]] for g in p.gpus)
        key = (len(p.switches), slowest, p.changes)
        if best is None or key < best[0]:
            best = (key, p, models)
        if key[:2] == (1, min(speed.values())):
            break  # one switch and the fastest model: no later candidate can beat it
    if best is None:
        raise error
    _, p, models = best
    return _with_note(p, _count_note(occ, req, p, models, free_text, len(candidates) > 1, speed))


def _free(occ: Occupancy, fixed: bool) -> list[int]:
    if not fixed:
        return list(occ.free_model)
    return [sum(occ.free_wired[g][m] for g in range(len(occ.ix.groups))) for m in range(len(occ.ix.models))]


def _fastest_mix(free: list[int], speed: dict[int, float], n: int) -> list[int]:
    """The models of the fastest GPUs that add up to `n`: every set drawn from them has the fastest slowest GPU."""
    models, have = [], 0
    for m in sorted(range(len(free)), key=speed.get):
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
        model = ix.rack.gpus[g].model
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
