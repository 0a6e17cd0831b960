"""Who holds what on a rack, kept in incremental indices so that placement never rescans the rack.

`RackIndex` (controller/core/rackindex.py) gives every port, GPU, aggregator switch, GPU model and (OCS, line
rate) group an integer id; it is built once per `Rack` and cached. `Occupancy` is the mutable state placement
reads: each port's circuit partner, each GPU's holder (a job id, or None when idle) and switch,
and, per switch and group, the downlinks with no circuit (`empty`) and those whose circuit goes
to an idle GPU (`idle`: a job may take them by cutting that circuit). Idle GPUs are indexed by
group and model, under their switch or loose (no circuit). Every change is O(1) and can be
journalled and rolled back, which is how planners try placements without copying the rack.

A circuit always joins a GPU's NIC port and a switch downlink on one OCS at one rate
(`controller.core.circuits.check_circuits`); the indices rely on that.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager

import numpy as np

from controller.core.circuits import Circuit, CircuitMap
from controller.core.rack import Rack
from controller.core.rackindex import RackIndex, index_of  # noqa: F401 (occupancy's names too)


class Occupancy:
    """Circuits and GPU holders of one rack, indexed for placement. Mutate only through the methods."""

    def __init__(self, rack: Rack, circuits: CircuitMap | None = None, holders: Mapping[str, str] | None = None):
        ix = self.ix = index_of(rack)
        self.rack = rack
        nw, ng, nm = len(ix.switches), len(ix.groups), len(ix.models)
        self.partner = [-1] * len(ix.ports)
        self.holder: list[str | None] = [None] * len(ix.gpus)
        self.loc = [-1] * len(ix.gpus)  # switch id, or -1 without a circuit
        self.empty = [[set(ix.downlinks[w][g]) for g in range(ng)] for w in range(nw)]
        self.idle: list[list[set[int]]] = [[set() for _ in range(ng)] for _ in range(nw)]
        self.free_under: list[list[list[set[int]]]] = [
            [[set() for _ in range(nm)] for _ in range(ng)] for _ in range(nw)]
        self.free_loose: list[list[set[int]]] = [[set() for _ in range(nm)] for _ in range(ng)]
        # the idle GPUs of `free_under` again, by switch and model, and by group and model
        self.free_at: list[list[set[int]]] = [[set() for _ in range(nm)] for _ in range(nw)]
        self.wired_free: list[list[set[int]]] = [[set() for _ in range(nm)] for _ in range(ng)]
        self.free_wired = [[0] * nm for _ in range(ng)]
        self.free_model = [0] * nm
        # the sizes of `free_under`, `empty` and `idle` as arrays, so that planners weigh every switch at once
        self.n_under = np.zeros((nw, ng, nm), dtype=np.int64)
        self.n_empty = np.array([[len(self.empty[w][g]) for g in range(ng)] for w in range(nw)], dtype=np.int64)
        self.n_empty.shape = (nw, ng)
        self.n_idle = np.zeros((nw, ng), dtype=np.int64)
        self.free_switch = [0] * nw  # idle GPUs under each switch (`n_under` summed over groups and models)
        self.n_stay = np.zeros((nw, nm), dtype=np.int64)  # `n_under` summed over groups
        # per switch, its downlinks with no circuit or with an idle GPU's (`n_empty` + `n_idle` over groups): no
        # placement step can put more GPUs under it, which bounds what a planner must weigh
        self.n_open = self.n_empty.sum(axis=1)
        self.n_bare = self.n_empty.sum(axis=1)  # per switch, its downlinks with no circuit (`n_empty` over groups)
        self.n_loose = np.zeros((ng, nm), dtype=np.int64)  # sizes of free_loose
        self.n_wired = np.zeros((ng, nm), dtype=np.int64)  # free_wired as an array
        # the same arrays as flat memoryviews of their memory (`.data`), indexed by one integer (w x groups + g, then
        # x models + m): a change of one count through them costs a third of numpy's scalar indexing (the same integers)
        self._ng, self._nm = ng, nm
        self._f_under, self._f_stay = self.n_under.reshape(-1).data, self.n_stay.reshape(-1).data
        self._f_empty, self._f_idle = self.n_empty.reshape(-1).data, self.n_idle.reshape(-1).data
        self._f_loose, self._f_wired = self.n_loose.reshape(-1).data, self.n_wired.reshape(-1).data
        self._f_open, self._f_bare = self.n_open.data, self.n_bare.data
        self._views = (self.free_under, self.free_at, self.wired_free, self.idle, self.free_loose, self._f_under,  # the
                       self._f_stay, self._f_open, self._f_wired, self._f_idle, self._f_loose, self.free_switch,  # held
                       self.free_wired, self.free_model)  # GPUs' indices, for _hold_all and _free_all
        for gi in range(len(ix.gpus)):
            self.free_loose[ix.gpu_group[gi]][ix.gpu_model[gi]].add(gi)
            self.n_loose[ix.gpu_group[gi], ix.gpu_model[gi]] += 1
            self.free_model[ix.gpu_model[gi]] += 1
        self.jobs: dict[str, list[int]] = {}  # holder -> GPU ids
        self._journal: list | None = None
        self._map: CircuitMap | None = CircuitMap()
        self.sync(circuits if circuits is not None else CircuitMap(), holders or {})

    # --- primitives (each journalled) -----------------------------------------------------
    def _connect(self, gi: int, d: int) -> None:
        ix = self.ix
        gp, w, g = ix.gpu_port[gi], ix.port_switch[d], ix.port_group[d]
        self.partner[gp], self.partner[d] = d, gp
        self.empty[w][g].discard(d)
        wg = w * self._ng + g
        self._f_empty[wg] -= 1
        self._f_bare[w] -= 1
        self.loc[gi] = w
        if self.holder[gi] is None:  # an empty downlink becomes an idle one: n_open stays
            m, nm = ix.gpu_model[gi], self._nm
            gm = g * nm + m
            self.free_loose[g][m].discard(gi)
            self._f_loose[gm] -= 1
            self.free_under[w][g][m].add(gi)
            self.free_at[w][m].add(gi)
            self.wired_free[g][m].add(gi)
            self._f_under[wg * nm + m] += 1
            self._f_stay[w * nm + m] += 1
            self.free_switch[w] += 1
            self.free_wired[g][m] += 1
            self._f_wired[gm] += 1
            self.idle[w][g].add(d)
            self._f_idle[wg] += 1
        else:
            self._f_open[w] -= 1
        self._map = None
        if self._journal is not None:
            self._journal.append((self._disconnect, gi))

    def _disconnect(self, gi: int) -> None:
        ix = self.ix
        gp = ix.gpu_port[gi]
        d = self.partner[gp]
        w, g = ix.port_switch[d], ix.port_group[d]
        self.partner[gp] = self.partner[d] = -1
        self.empty[w][g].add(d)
        wg = w * self._ng + g
        self._f_empty[wg] += 1
        self._f_bare[w] += 1
        self.loc[gi] = -1
        if self.holder[gi] is None:  # an idle downlink becomes an empty one: n_open stays
            m, nm = ix.gpu_model[gi], self._nm
            gm = g * nm + m
            self.free_under[w][g][m].discard(gi)
            self.free_at[w][m].discard(gi)
            self.wired_free[g][m].discard(gi)
            self._f_under[wg * nm + m] -= 1
            self._f_stay[w * nm + m] -= 1
            self.free_switch[w] -= 1
            self.free_loose[g][m].add(gi)
            self._f_loose[gm] += 1
            self.free_wired[g][m] -= 1
            self._f_wired[gm] -= 1
            self.idle[w][g].discard(d)
            self._f_idle[wg] -= 1
        else:
            self._f_open[w] += 1
        self._map = None
        if self._journal is not None:
            self._journal.append((self._connect, gi, d))

    def _hold(self, gi: int, job: str) -> None:
        self._hold_all((gi,), job)

    def _hold_all(self, ids: Iterable[int], job: str) -> None:
        """`_hold` of each of `ids` in turn (the same changes in the same order), the lookups made once."""
        ix, nm, ng, loc, holder, journal = self.ix, self._nm, self._ng, self.loc, self.holder, self._journal
        gpu_group, gpu_model, gpu_port, partner = ix.gpu_group, ix.gpu_model, ix.gpu_port, self.partner
        (free_under, free_at, wired_free, idle, free_loose, f_under, f_stay, f_open, f_wired, f_idle, f_loose,
         free_switch, free_wired, free_model) = self._views
        held = self.jobs.get(job)
        if made := held is None:
            held = self.jobs[job] = []
        before = len(held)
        for gi in ids:
            g, m, w = gpu_group[gi], gpu_model[gi], loc[gi]
            if w >= 0:
                wg = w * ng + g
                free_under[w][g][m].discard(gi)
                free_at[w][m].discard(gi)
                wired_free[g][m].discard(gi)
                f_under[wg * nm + m] -= 1
                f_stay[w * nm + m] -= 1
                f_open[w] -= 1
                free_switch[w] -= 1
                free_wired[g][m] -= 1
                f_wired[g * nm + m] -= 1
                idle[w][g].discard(partner[gpu_port[gi]])
                f_idle[wg] -= 1
            else:
                free_loose[g][m].discard(gi)
                f_loose[g * nm + m] -= 1
            free_model[m] -= 1
            holder[gi] = job
            held.append(gi)
        if journal is not None and len(held) > before:  # one entry: `_unhold` of each, the last first
            journal.append((self._unhold_all, held[before:][::-1]))
        if made and not held:
            del self.jobs[job]

    def _unhold_all(self, ids: Sequence[int]) -> None:
        """`_unhold` of each of `ids` in turn (held GPUs): the same lists and indexes after, and one journal entry per
        run of GPUs of one job (`_hold_all` of the run, the last first: what `_hold` of each, the last first, does)."""
        holder, jobs, journal = self.holder, self.jobs, self._journal
        run: list[int] = []
        for gi in ids:
            job = holder[gi]
            assert job is not None, f"GPU {self.ix.gpus[gi]} is not held"
            held = jobs[job]
            if held[-1] == gi:
                held.pop()
            elif held[0] == gi:
                del held[0]
            else:
                held.remove(gi)
            if not held:
                del jobs[job]
            if journal is not None:
                if run and holder[run[-1]] != job:
                    journal.append((self._hold_all, run[::-1], holder[run[-1]]))
                    run = []
                run.append(gi)
        if run:
            journal.append((self._hold_all, run[::-1], holder[run[-1]]))  # type: ignore[union-attr]
        self._free_all(ids)

    def _unhold(self, gi: int) -> None:
        job = self.holder[gi]
        assert job is not None, f"GPU {self.ix.gpus[gi]} is not held"
        held = self.jobs[job]
        if held[-1] == gi:  # a job's GPUs are freed in the order they were held, or the last first (a rollback)
            held.pop()
        elif held[0] == gi:
            del held[0]
        else:
            held.remove(gi)
        if not held:
            del self.jobs[job]
        self._free_all((gi,))
        if self._journal is not None:
            self._journal.append((self._hold, gi, job))

    def _free_all(self, ids: Iterable[int]) -> None:
        """`_unhold`'s index changes (idle again) for each of `ids` in turn, not taking them off the job's list."""
        ix, nm, ng, loc, holder = self.ix, self._nm, self._ng, self.loc, self.holder
        gpu_group, gpu_model, gpu_port, partner = ix.gpu_group, ix.gpu_model, ix.gpu_port, self.partner
        (free_under, free_at, wired_free, idle, free_loose, f_under, f_stay, f_open, f_wired, f_idle, f_loose,
         free_switch, free_wired, free_model) = self._views
        for gi in ids:
            g, m, w = gpu_group[gi], gpu_model[gi], loc[gi]
            holder[gi] = None
            if w >= 0:
                wg = w * ng + g
                free_under[w][g][m].add(gi)
                free_at[w][m].add(gi)
                wired_free[g][m].add(gi)
                f_under[wg * nm + m] += 1
                f_stay[w * nm + m] += 1
                f_open[w] += 1
                free_switch[w] += 1
                free_wired[g][m] += 1
                f_wired[g * nm + m] += 1
                idle[w][g].add(partner[gpu_port[gi]])
                f_idle[wg] += 1
            else:
                free_loose[g][m].add(gi)
                f_loose[g * nm + m] += 1
            free_model[m] += 1

    def move(self, gi: int, d: int) -> list[tuple[int, int]]:
        """Circuit GPU `gi` to downlink `d`, cutting what either had; returns the (gpu port, downlink) cut."""
        ix = self.ix
        cut: list[tuple[int, int]] = []
        old = self.partner[ix.gpu_port[gi]]
        if old == d:
            return cut
        if old >= 0:
            cut.append((ix.gpu_port[gi], old))
            self._disconnect(gi)
        other = self.partner[d]
        if other >= 0:
            cut.append((other, d))
            self._disconnect(ix.port_gpu[other])
        self._connect(gi, d)
        return cut

    # --- tentative changes --------------------------------------------------------------------
    @contextmanager
    def tentative(self):
        """Changes made inside are undone on exit, exception or not (no nesting)."""
        if self._journal is not None:
            raise RuntimeError("Occupancy.tentative() does not nest")
        self._journal = journal = []
        saved_map = self._map
        try:
            yield
        finally:
            if self._journal is not None:  # else keep() was called: the changes stay
                self._journal = None
                for undo, *args in reversed(journal):
                    undo(*args)
                self._map = saved_map

    def keep(self) -> None:
        """Inside `tentative()`: the changes made so far stay (as if made outside it); later ones are not undone."""
        self._journal = None

    # --- the public, name-based interface -------------------------------------------------------
    def hold(self, job: str, gpus: Iterable[str]) -> None:
        """Mark idle GPUs as held by `job`."""
        for name in gpus:
            gi = self.ix.gpu_id[name]
            if self.holder[gi] is not None:
                raise ValueError(f"{name} is held by {self.holder[gi]}")
            self._hold(gi, job)

    def take_over(self, planner: str, job: str, gpus: Iterable[str]) -> None:
        """Mark `gpus` held by `job`, as `release(planner)` then `hold(job, gpus)` would leave them: those `planner`
        holds change holder only (held before and after: no index changes), the idle ones are held."""
        ix, holder = self.ix, self.holder
        ids = [ix.gpu_id[name] for name in gpus]
        planned = set(self.jobs.get(planner, ()))
        if not planned <= set(ids):
            raise ValueError(f"{planner} holds GPUs that {job} does not take")
        busy = [ix.gpus[gi] for gi in ids if gi not in planned and holder[gi] is not None]
        if busy:
            raise ValueError(f"{busy[0]} is held by {holder[ix.gpu_id[busy[0]]]}")
        self.jobs.pop(planner, None)
        mine = self.jobs.setdefault(job, [])
        if not planned:
            self._hold_all(ids, job)
            return
        for gi in ids:
            if gi in planned:
                holder[gi] = job
                mine.append(gi)
            else:
                self._hold(gi, job)

    def commit(self, job: str, plan) -> None:
        """Apply a placement plan (controller.core.placement.Plan): its circuits, and its GPUs held by `job`."""
        self.apply(plan.remove, plan.add)
        self.hold(job, plan.gpus)

    def release(self, job: str) -> None:
        """Free every GPU `job` holds (their circuits stay), in the order it took them (as `_unhold` one by one)."""
        if self._journal is not None:
            for gi in list(self.jobs.get(job, ())):
                self._unhold(gi)
            return
        self._free_all(self.jobs.pop(job, ()))

    def apply(self, remove: Iterable[Circuit] = (), add: Iterable[Circuit] = ()) -> None:
        """Change circuits: `remove` first, then `add` (GPU-port / downlink pairs)."""
        ix = self.ix
        for a, b in remove:
            gi = ix.port_gpu[ix.port_id[a]]
            self._disconnect(gi if gi >= 0 else ix.port_gpu[ix.port_id[b]])
        for a, b in add:
            pa, pb = ix.port_id[a], ix.port_id[b]
            gp, d = (pa, pb) if ix.port_gpu[pa] >= 0 else (pb, pa)
            self._connect(ix.port_gpu[gp], d)

    def sync(self, circuits: CircuitMap, holders: Mapping[str, str]) -> None:
        """Make this state equal to `circuits` and `holders` (GPU -> job) by applying only the differences."""
        current = self.circuits
        if circuits is not current:
            d = current.diff(circuits)
            self.apply(sorted(d.remove), sorted(d.add))
        self._map = circuits
        ix = self.ix
        for gi, job in enumerate(self.holder):
            want = holders.get(ix.gpus[gi])
            if job != want:
                if job is not None:
                    self._unhold(gi)
                if want is not None:
                    self._hold(gi, want)

    @property
    def circuits(self) -> CircuitMap:
        """The circuits now, as a CircuitMap (built once per change)."""
        if self._map is None:
            ix = self.ix
            self._map = CircuitMap(ix.circuit(gp, self.partner[gp]) for gp in ix.gpu_port if self.partner[gp] >= 0)
        return self._map

    def switch_of(self, gpu: str) -> str | None:
        w = self.loc[self.ix.gpu_id[gpu]]
        return self.ix.switches[w] if w >= 0 else None

    def holders(self) -> dict[str, str]:
        return {self.ix.gpus[gi]: job for job, ids in self.jobs.items() for gi in ids}

    def free_by_model(self) -> dict[str, int]:
        return {m: self.free_model[i] for i, m in enumerate(self.ix.models)}
