"""Defragmentation: one joint plan that regroups running jobs, applied as one bulk OCS change.

Priority: fewest switches summed over the jobs, then fewest circuits changed. A job whose switch
count would not fall is not touched (its circuits stay, so it does not stall), and a job already
under one switch never moves. The planner releases the jobs that may gain, places them again one
by one (largest first, then most switches first; the better of the two orders wins), each under
the fewest switches with the fewest changes (`controller.core.placement`), where a later job may
take a downlink an earlier one left; a job that would not gain is then fixed in place and the
round is planned again. Everything happens inside `Occupancy.tentative()`: `occ` is unchanged.

    d = plan_defrag(occ, {"job-1": gpus_in_rank_order, ...})   # running jobs, held in occ
    d.moves, d.kept, d.remove, d.add, d.switches_before, d.switches_after
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controller.core.circuits import Changes, Circuit
from controller.core.occupancy import Occupancy
from controller.core.placement import NoRoomNow
from controller.core.placing import _place
from controller.core.pools import _Named


@dataclass(frozen=True)
class Move:
    job: str
    before: tuple[str, ...]  # switches
    after: tuple[str, ...]
    remove: frozenset[Circuit]  # this job's circuits that go
    add: frozenset[Circuit]  # and those that come


@dataclass(frozen=True)
class Defrag(Changes):
    moves: tuple[Move, ...]
    kept: dict[str, str] = field(default_factory=dict)  # job -> why it is not touched
    remove: frozenset[Circuit] = frozenset()  # every circuit that goes (idle GPUs' too)
    add: frozenset[Circuit] = frozenset()
    switches_before: int = 0  # summed over the jobs
    switches_after: int = 0
    where: dict[str, str | None] = field(default_factory=dict)  # GPU -> switch after the plan (jobs' GPUs)


def _switches(occ: Occupancy, ids: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted({occ.loc[gi] for gi in ids}))


def plan_defrag(occ: Occupancy, jobs: Mapping[str, Sequence[str]]) -> Defrag:
    """The joint regrouping of `jobs` (job -> its GPUs, each held by that job in `occ`)."""
    ix = occ.ix
    ids = {j: [ix.gpu_id[g] for g in gpus] for j, gpus in jobs.items()}
    for j, v in ids.items():
        strangers = [ix.gpus[gi] for gi in v if occ.holder[gi] != j]
        if strangers:
            raise ValueError(f"{', '.join(strangers)} not held by {j}")
    before = {j: _switches(occ, v) for j, v in ids.items()}
    kept = {j: "already under one switch" for j, s in before.items() if len(s) <= 1 and -1 not in s}
    orders = [sorted(jobs, key=lambda j: (-len(ids[j]), -len(before[j]))),
              sorted(jobs, key=lambda j: (-len(before[j]), -len(ids[j])))]
    best: Defrag | None = None
    for order in orders:
        d = _plan_in_order(occ, ids, before, dict(kept), order)
        if best is None or (d.switches_after, d.changes) < (best.switches_after, best.changes):
            best = d
    assert best is not None  # two orders were tried
    return best


def _plan_in_order(occ: Occupancy, ids, before, kept: dict[str, str], order: list[str]) -> Defrag:
    while True:
        movers = [j for j in order if j not in kept]
        worse: dict[str, str] = {}
        with occ.tentative():
            for j in movers:
                occ._unhold_all(ids[j])  # each GPU's `_unhold` in turn
            original: dict[int, int] = {}
            for j in movers:
                try:
                    _place(occ, _Named(occ, ids[j]), len(ids[j]), False, original)
                except NoRoomNow:
                    worse[j] = "no room for it once the others moved"
                    break
                occ._hold_all(ids[j], j)  # each GPU's `_hold` in turn
                n_before, n_after = len(before[j]), len(_switches(occ, ids[j]))
                if n_after >= n_before:
                    worse[j] = f"cannot fall below {n_before} switches"
            if not worse:
                return _result(occ, ids, before, kept, movers, original)
        kept.update(worse)


def _result(occ: Occupancy, ids, before, kept, movers, original: dict[int, int]) -> Defrag:
    """Read the plan off `occ` (inside the tentative change)."""
    ix = occ.ix
    remove: set[Circuit] = set()
    add: set[Circuit] = set()
    owner: dict[int, str] = {}
    for j in movers:
        owner.update({gi: j for gi in ids[j]})
    per_job: dict[str, tuple[set, set]] = {j: (set(), set()) for j in movers}
    for gi, was in original.items():
        gp, now = ix.gpu_port[gi], occ.partner[ix.gpu_port[gi]]
        if was == now:
            continue
        cut = ix.circuit(gp, was) if was >= 0 else None
        made = ix.circuit(gp, now) if now >= 0 else None
        for c, into in ((cut, remove), (made, add)):
            if c is not None:
                into.add(c)
                if gi in owner:
                    per_job[owner[gi]][into is add].add(c)
    names = ix.switches
    moves = tuple(Move(j, tuple(names[w] for w in before[j] if w >= 0), tuple(names[w] for w in _switches(occ, ids[j])),
                       frozenset(per_job[j][0]), frozenset(per_job[j][1]))
                  for j in movers if per_job[j][0] or per_job[j][1])
    after = {j: len(_switches(occ, ids[j])) if j in movers else len(before[j]) for j in ids}
    where = {ix.gpus[gi]: (names[occ.loc[gi]] if occ.loc[gi] >= 0 else None) for v in ids.values() for gi in v}
    return Defrag(moves, kept, frozenset(remove), frozenset(add), sum(len(b) for b in before.values()),
                  sum(after.values()), where)


def _pairs(circuits) -> list[list[str]]:
    return [[str(a), str(b)] for a, b in sorted(circuits)]


def describe(rack, d: Defrag, jobs: Mapping[str, Sequence[str]], where: Mapping[str, str | None],
             workloads: Mapping[str, str], remaining: Mapping[str, int], stall_s: float) -> dict:
    """The plan as JSON, with each job's predicted iteration time before and after (controller.core.perf):
    `jobs` in rank order, `where` each GPU's switch now, `remaining` iterations left per job."""
    from controller.core.perf import iteration_seconds

    before = iteration_seconds(rack, jobs, where, workloads)
    after = iteration_seconds(rack, jobs, {**where, **d.where}, workloads)
    moved = {m.job: m for m in d.moves}

    def prediction(job: str) -> dict:
        left = remaining.get(job, 0)
        saved = left * (before[job] - after[job]) - (stall_s if job in moved else 0.0)
        return {"iteration_s_before": round(before[job], 6), "iteration_s_after": round(after[job], 6),
                "remaining_iterations": left, "predicted_saving_s": round(saved, 6)}

    return {
        "jobs_moved": [{"job": m.job, "switches_before": list(m.before), "switches_after": list(m.after),
                        "circuits_removed": _pairs(m.remove), "circuits_added": _pairs(m.add), **prediction(m.job)}
                       for m in d.moves],
        "jobs_untouched": [{"job": j, "reason": why, "switches": sorted({where[g] for g in jobs[j] if where.get(g)}),
                            **prediction(j)} for j, why in sorted(d.kept.items())],
        "circuits": {"remove": _pairs(d.remove), "add": _pairs(d.add)},
        "circuits_changed": d.changes,
        "expected_stall_s": stall_s if d.moves else 0.0,
        "switches_before": d.switches_before,
        "switches_after": d.switches_after,
        "predicted_saving_s": round(sum(prediction(j)["predicted_saving_s"] for j in jobs), 6),
    }
