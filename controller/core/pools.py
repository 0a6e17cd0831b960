"""The pools a placement step chooses GPUs from, and how many of them each switch takes at what cost: the
combinatorial core of controller/core/placement.py, apart so that each module stays readable (the steps that place
them: controller/core/placing.py)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import chain

import numpy as np

from controller.core.occupancy import Occupancy

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
        # every one of them under a switch is idle (defragmentation's movers, unheld): `under` is `idle_under`
        self.all_idle = sum(k for per in self.idle_under.values() for k in per.values()) == sum(self.n_wired)

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

    def best(self, occ: Occupancy, need: int, fixed: bool, used: list[int]) -> tuple[int, int, int] | None:
        """(fits, cost, switch) of the first switch that takes the most of `need`, then with the fewest changes."""
        shape = occ.n_idle.shape
        under = np.zeros(shape, dtype=np.int64)
        for w, per in self.under.items():
            for g, ids in per.items():
                under[w, g] = len(ids)
        if self.all_idle and not fixed:  # `_bounded`'s bound holds (each GPU under a switch on an open downlink)
            return _bounded(occ, need, used, under.sum(axis=1), lambda _, rows: under[rows], self.groups,
                            self.n_loose, self.n_wired)
        idle_under = np.zeros(shape, dtype=np.int64)
        for w, idle_per in self.idle_under.items():
            for g, k in idle_per.items():
                idle_under[w, g] = k
        return _best(occ, need, fixed, used, under, idle_under, self.n_loose, self.n_wired)

    def rows(self, occ: Occupancy, w: int) -> list[tuple[int, int, int, int]]:
        under, idle_under = self.under.get(w, {}), self.idle_under.get(w, {})
        return [(g, *_split(self.n_loose[g], self.n_wired[g] - len(under.get(g, ())), len(occ.empty[w][g]),
                            len(occ.idle[w][g]) - idle_under.get(g, 0))) for g in self.groups]

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

    def __init__(self, occ: Occupancy, models: Sequence[int], counted: bool = True):
        """`counted` False: for the fixed policy, whose steps read only `occ.n_stay` and the idle GPUs under a switch
        (`best` and `stayers`): the pool's loose and wired counts per group are not taken (reading them raises)."""
        self.occ, self.models, self.counted = occ, list(models), counted
        if not counted:
            return
        if len(self.models) == 1:  # one model's column (the sum over one column, without the copy and the sum)
            loose, wired = occ.n_loose[:, self.models[0]], occ.n_wired[:, self.models[0]]
        else:
            loose, wired = occ.n_loose[:, self.models].sum(axis=1), occ.n_wired[:, self.models].sum(axis=1)
        self.n_loose, self.n_wired = loose.tolist(), wired.tolist()
        self.groups = np.flatnonzero(loose + wired).tolist()

    def best(self, occ: Occupancy, need: int, fixed: bool, used: list[int]) -> tuple[int, int, int] | None:
        """(fits, cost, switch) of the first switch that takes the most of `need`, then with the fewest changes."""
        models = self.models
        stay = occ.n_stay[:, models[0]] if len(models) == 1 else occ.n_stay[:, models].sum(axis=1)
        if fixed:  # no moves: the switch with the most of the pool's idle GPUs under it
            fits = np.minimum(stay, need)
            if used:
                fits[used] = 0
            w = int(np.argmax(fits))
            return (int(fits[w]), 0, w) if fits[w] > 0 else None
        return _bounded(occ, need, used, stay, self._under, self.groups, self.n_loose, self.n_wired)

    def _under(self, occ: Occupancy, rows: np.ndarray) -> np.ndarray:
        """The pool's idle GPUs under the switches `rows`, per group."""
        if len(self.models) == 1:
            return occ.n_under[rows, :, self.models[0]]
        return occ.n_under[rows][:, :, self.models].sum(axis=2)

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
        """(group, movers at cost 1, 2, 3) for switch `w`, each group's `_split` (of the pool's loose and wired GPUs
        but its idle ones under `w`, `w`'s empty downlinks and those of idle GPUs not the pool's): computed for the
        pool's groups at once from the occupancy's counts (`n_under`, `n_empty`, `n_idle`: the sets' sizes), the same
        integers."""
        groups = self.groups
        if not groups:
            return []
        g = np.asarray(groups, dtype=np.intp)
        models = self.models
        s = occ.n_under[w, g, models[0]] if len(models) == 1 else occ.n_under[w][g][:, models].sum(axis=1)
        u, e = np.asarray(self.n_loose, dtype=np.int64)[g], occ.n_empty[w, g]
        n = np.asarray(self.n_wired, dtype=np.int64)[g] - s + u  # u + c
        np.minimum(n, occ.n_idle[w, g] - s + e, out=n)  # against e + i
        np.maximum(n, 0, out=n)  # none where n <= 0
        n1 = np.minimum(np.minimum(u, e), n)
        n3 = np.maximum(n - np.maximum(u, e), 0)
        return list(zip(groups, n1.tolist(), (n - n1 - n3).tolist(), n3.tolist(), strict=True))

    def stayers(self, w: int, k: int) -> list[int]:
        at = self.occ.free_at[w]  # every idle GPU of the pool's models under w is in one of its groups
        return sorted(chain.from_iterable(at[m] for m in self.models))[:k]  # nsmallest's (ids differ), in C

    def movers(self, g: int, w: int, k: int) -> list[int]:
        occ = self.occ
        loose = heapq.nsmallest(k, chain.from_iterable(occ.free_loose[g][m] for m in self.models))
        if len(loose) == k:
            return loose
        k -= len(loose)
        here = [gi for m in self.models for gi in occ.free_under[w][g][m]]  # wired, but under w already
        wired = heapq.nsmallest(k + len(here), chain.from_iterable(occ.wired_free[g][m] for m in self.models))
        if here:
            wired = [gi for gi in wired if gi not in here][:k]
        return loose + wired

    def rest(self, occ: Occupancy, placed: list[int]):
        """The pool without `placed` (they are held by the plan now)."""
        occ._hold_all(placed, _PLANNING)
        return _Models(occ, self.models, self.counted)

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


def _tiers(occ: Occupancy, rows, under, idle_under, n_loose, n_wired) -> tuple:
    """_split for the switches `rows` (a slice or index array; `under`, `idle_under`: those rows), summed over the
    groups: (n1, n2, n3) per switch. In place where an array is this call's own (integers: the same values)."""
    u, e = np.asarray(n_loose, dtype=np.int64), occ.n_empty[rows]
    n = np.asarray(n_wired, dtype=np.int64) - under  # c, then u + c, then n
    n += u
    i = occ.n_idle[rows] - idle_under
    i += e
    np.minimum(n, i, out=n)
    np.maximum(n, 0, out=n)
    a = np.minimum(u, e)
    np.minimum(a, n, out=a)
    b = np.maximum(u, e)
    np.subtract(n, b, out=b)
    np.maximum(b, 0, out=b)
    n1, n3 = a.sum(axis=1), b.sum(axis=1)
    return n1, n.sum(axis=1) - n1 - n3, n3


def _fit_cost(need: int, stay, n1, n2, n3) -> tuple:
    """`_cost` for every switch at once: (fits, cost) per switch."""
    k = need - stay
    kk = np.maximum(k, 0)
    t1 = np.minimum(kk, n1)
    t2 = np.minimum(kk - t1, n2)
    t3 = np.minimum(kk - t1 - t2, n3)
    return np.where(k <= 0, need, stay + t1 + t2 + t3), np.where(k <= 0, 0, t1 + 2 * t2 + 3 * t3)


def _best(occ: Occupancy, need: int, fixed: bool, used: list[int], under, idle_under, n_loose, n_wired) \
        -> tuple[int, int, int] | None:
    """`totals` and `_cost` for every switch at once, from the pool's GPUs under each switch and group (`under`, the
    idle ones `idle_under`) and its loose and wired GPUs per group: (fits, cost, switch) of the first switch that
    takes the most of `need`, then with the fewest changes, as weighing them one by one in order would; None when
    none takes any."""
    stay = under.sum(axis=1)
    if fixed:
        fits, cost = np.minimum(stay, need), np.zeros_like(stay)
    else:
        fits, cost = _fit_cost(need, stay, *_tiers(occ, slice(None), under, idle_under, n_loose, n_wired))
    if used:
        fits[used] = 0
    score = fits * (3 * need + 1) - cost  # most GPUs first, then fewest changes; argmax takes the first
    w = int(np.argmax(score))
    return (int(fits[w]), int(cost[w]), w) if fits[w] > 0 else None


_FIRST = 4  # switches weighed in full before the bound sets aside the rest


def _bounded(occ: Occupancy, need: int, used: list[int], stay: np.ndarray, under_of, groups, n_loose, n_wired) \
        -> tuple[int, int, int] | None:
    """`_best` for a pool whose `under` and `idle_under` are one (`under_of(occ, rows)`), weighing in full only the
    switches that could win. A switch takes no more of the pool than `need`, its open downlinks (`occ.n_open`) and
    its downlinks in the pool's groups allow; each GPU beyond its `stay` costs two changes or more, but one for as
    many as the loose GPUs and its empty downlinks allow; and a score (fits x (3 need + 1) - cost) rises with fits,
    so `top` bounds a switch's score. The `_FIRST` switches of highest bound are weighed, then every other whose bound
    passes the best score so far (or equals it, before the best): those left out score less, or as much but later, so
    the winner (the highest score, then the first switch) is `_best`'s. First of all, a switch with `need` of the pool
    under it scores the most any can (all of `need` at no change): the first such switch wins, nothing else weighed."""
    ok = stay >= need
    if used:
        ok[used] = False
    w = int(ok.argmax())
    if ok[w]:
        return need, 0, w
    weight = 3 * need + 1
    ub = np.minimum(occ.n_open, min(need, sum(occ.ix.group_width[g] for g in groups)))
    k = np.maximum(ub - stay, 0)  # moves to fill it; at cost 1 only a loose GPU to an empty downlink, the rest 2 or 3
    top = ub * weight - 2 * k + np.minimum(k, np.minimum(occ.n_bare, sum(n_loose)))
    if used:
        top[used] = -1  # a switch a step used takes nothing more (every other's bound is 0 or more)
    order = np.argsort(-top, kind="stable")
    rows = order[:_FIRST]
    rows = rows[top[rows] >= 0]
    if not len(rows):
        return None
    def weigh(rows):
        under = under_of(occ, rows)
        return _fit_cost(need, stay[rows], *_tiers(occ, rows, under, under, n_loose, n_wired))

    fits, cost = weigh(rows)
    score = fits * weight - cost
    high = max(int(score.max()), 0)
    first = int(rows[score == high].min()) if high > 0 else len(top)
    rest = order[_FIRST:]
    rest = rest[(top[rest] > high) | ((top[rest] == high) & (rest < first))]  # could beat it, or tie and be first
    if len(rest):
        f2, c2 = weigh(rest)
        rows, fits, cost = np.concatenate((rows, rest)), np.concatenate((fits, f2)), np.concatenate((cost, c2))
        score = fits * weight - cost
    winners = rows[score == score.max()]
    i = int(np.flatnonzero(rows == winners.min())[0])
    return (int(fits[i]), int(cost[i]), int(rows[i])) if fits[i] > 0 else None
