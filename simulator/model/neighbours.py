"""The neighbours' architectures as fabrics and collectives of the simulator.

A policy may name a `fabric` other than the rack's (the electrical aggregator switches under a core, with
OCS regrouping) or a `collective` other than ring all-reduce; the engine builds a job's ring as usual and
this module turns it into what the neighbour's architecture would run:

- `oddl` (ODDL, seed 001): all-optical, every node on a horizontal and a vertical wavelength-selective
  switch (a side x side grid, side = ceil(sqrt(nodes)); 1,024 nodes on 64 WSSs of 32 ports, 4,096 on 128 of
  64). A flow gets its own wavelength circuit, so no flow shares a link; a node in the same row or column
  is one hop away, any other two (relayed by the node at the sender's row and the receiver's column). Every
  ring step's flows set up their circuits first: hops x (switching delay + the distributed control's per-flow
  overhead), the step waiting for its slowest flow.
- `topoopt` (TopoOpt-like, seed 003): a job's own topology, set once when it is placed (one OCS
  reconfiguration) and kept: its ring spread over `topoopt_degree` parallel rings on as many NICs per GPU,
  no link shared with another job.
- `sipml` (SiP-ML-like, seed 004): an all-optical silicon-photonic fabric of `sipml_gbps` per GPU, no link
  shared, a circuit set up per ring step (`sipml_setup_s`).
- collective `ina` (PANAMA, seed 002): in-network aggregation at every switch on the job's tree (the
  PSwitch is bump-in-the-wire at each switch): each GPU sends its gradient once and receives the sum once,
  every link of the tree carries one stream of the gradient in each direction. The trees over several roots
  that PANAMA balances load with share the same links in a rack with one core; see simulator/model/shortflows.py
  for where they differ (several spines).
- sharing `mltcp` (MLTCP, seed 003): regroup's placement, and rings that transfer on a shared link split it by
  weights that grow with the share of their iteration's bytes sent (simulator/model/sharing.py: MltcpInterference), so
  they drift into interleaving; a component of rings too large to step through keeps fair shares.
- collective `ina-single` (SwitchML-like): one aggregation tree whose only aggregating switch is the root
  (the job's first switch): every other switch's stream crosses the core and the root's downlink, so that
  link carries k-1 streams up and k-1 results back.
- collective `ina-root` (the emulated rack's aggregator, docs/neighbour-panama.md): one aggregator, at the root
  switch, and none on the way: each GPU under another switch streams its own gradient to it and gets the sum back,
  so each link of its switch's route carries one stream per GPU under it, each way (ina-single aggregates each
  switch's GPUs first: one stream per switch).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from controller.core.circuits import CircuitDiff
from simulator.model.engine import Policy, Run, RunResult
from simulator.model.rings import Ring
from simulator.model.sharing import MltcpInterference
from simulator.studies import metrics

FABRICS = {"oddl": "ODDL: 2-D WSS all-optical, a circuit per flow",
           "topoopt": "TopoOpt-like: a per-job topology set once, parallel rings",
           "sipml": "SiP-ML-like: all-optical silicon photonics, Tbit/s per GPU"}
COLLECTIVES = {"ring": "ring all-reduce", "ina": "in-network aggregation at every switch (PANAMA)",
               "ina-single": "one aggregation tree, aggregation at its root only (SwitchML-like)",
               "ina-root": "one aggregator, at the root switch; every other GPU streams to it (the emulated rack's)"}


@dataclass(frozen=True)
class Params:
    """The neighbours' parameters (the CLI's --oddl-*, --topoopt-*, --sipml-*)."""

    oddl_switch_s: float = 10.5e-9  # ODDL's measured wavelength switching (seed 001, Fig. 4)
    oddl_control_s: float = 1e-6  # per-flow control overhead: assumed (the paper gives no figure)
    topoopt_degree: int = 4  # NICs per GPU in a TopoOpt-like topology: assumed
    sipml_gbps: float = 4000.0  # per GPU ("multiple terabits per second", seed 004): assumed
    sipml_setup_s: float = 1e-6  # "microsecond reconfiguration latency is close to optimal" (seed 004)
    mltcp_slope: float = 2.0  # MLTCP: weight 1 + slope x bytes sent (share of the iteration's): assumed
    mltcp_levels: int = 16  # the share taken in this many steps (each crossing an event): assumed

    def check(self) -> None:
        """A ValueError naming the flag (as given, in its unit) of the first parameter out of its range."""
        for name, flag, per_s in (("oddl_switch_s", "--oddl-switch-ns", 1e9), ("oddl_control_s", "--oddl-control-us",
                                  1e6), ("sipml_setup_s", "--sipml-setup-us", 1e6)):
            v = getattr(self, name)
            if not 0 <= v < math.inf:
                raise ValueError(f"{flag} must be a finite time of 0 or more, not {v * per_s:g}")
        if self.topoopt_degree < 1:
            raise ValueError(f"--topoopt-degree must be at least 1, not {self.topoopt_degree}")
        if not 0 < self.sipml_gbps < math.inf:
            raise ValueError(f"--sipml-gbps must be positive, not {self.sipml_gbps:g}")
        if not 0 <= self.mltcp_slope < math.inf:
            raise ValueError(f"--mltcp-slope must be a finite number of 0 or more, not {self.mltcp_slope:g}")
        if self.mltcp_levels < 1:
            raise ValueError(f"mltcp levels must be at least 1, not {self.mltcp_levels}")


# --- ODDL's 2-D topology ---------------------------------------------------------------------
def oddl_side(nodes: int) -> int:
    """Nodes per WSS: the grid's side, the smallest square that holds `nodes`."""
    return max(1, math.isqrt(max(nodes, 1) - 1) + 1)


def oddl_wss(nodes: int) -> tuple[int, int]:
    """(WSSs, ports each): a horizontal and a vertical one per row and column of the grid."""
    side = oddl_side(nodes)
    rows = -(-nodes // side)
    return rows + side, side


def oddl_hops(a: int, b: int, side: int) -> int:
    """Circuits a flow from node a to node b needs: 1 in the same row or column, else 2 (relayed)."""
    if a == b:
        return 0
    (ra, ca), (rb, cb) = divmod(a, side), divmod(b, side)
    return 1 if ra == rb or ca == cb else 2


def oddl_step_setup_s(nodes: Sequence[int], side: int, p: Params) -> float:
    """Set-up time of one ring step over nodes (rank order): its slowest flow's circuits."""
    n = len(nodes)
    if n < 2:
        return 0.0
    worst = max(oddl_hops(nodes[i], nodes[(i + 1) % n], side) for i in range(n))
    return worst * (p.oddl_switch_s + p.oddl_control_s)


# --- in-network aggregation trees ---------------------------------------------------------------
def tree_links(switches: Sequence[str], route, root_only: bool, streams: Sequence[int] = ()) -> dict[int, int]:
    """Streams of the gradient on each directed link for one aggregation over the job's switches.
    `switches`: the distinct switches its GPUs hang under, the first the root; `route(a, b)`: link ids
    from switch a to b. Aggregating at every switch: one stream per link of the tree. At the root only:
    a stream per other switch on each link of its route, to the root and back, or, given `streams` (a count per
    switch, in the order of `switches`: its GPUs, none aggregated before the root), that many."""
    if len(switches) < 2:
        return {}
    root, links = switches[0], {}
    for i, s in enumerate(switches[1:], 1):
        for link in (*route(s, root), *route(root, s)):
            links[link] = 1 if not root_only else links.get(link, 0) + (streams[i] if streams else 1)
    return links


@dataclass
class TreeRing(Ring):
    """A job's all-reduce as another collective: `phase_steps` steps of `phase_bytes` on each of its flows."""

    phase_steps: int = 1
    phase_bytes: float = 0.0

    @property
    def steps(self) -> int:
        return self.phase_steps if self.n > 1 else 0

    @property
    def step_bytes(self) -> float:
        return self.phase_bytes


def adapt(ring: Ring, fabric: str, collective: str, p: Params, efficiency: float, nodes: Sequence[int] = (),
          side: int = 1, switches: Sequence[str] = (), route=None, per_switch: Sequence[int] = ()) -> Ring:
    """The job's ring as the neighbour runs it (`per_switch`: the job's GPUs under each of `switches`, for
    `ina-root`)."""
    if ring.n < 2:
        return ring
    if fabric == "oddl":  # every step's circuits set up before it moves (folded into the compute phase: exact
        # for a ring alone on its links, as every ODDL ring is; the GPUs are not counted as computing meanwhile)
        setup = oddl_step_setup_s(nodes, side, p)
        return replace(ring, links={}, compute_s=ring.compute_s + ring.steps * setup)
    if fabric == "topoopt":
        return replace(ring, links={}, cap=ring.cap * p.topoopt_degree)
    if fabric == "sipml":
        cap = p.sipml_gbps * 1e9 / 8 * efficiency
        return replace(ring, links={}, cap=cap, compute_s=ring.compute_s + ring.steps * p.sipml_setup_s)
    if collective in ("ina", "ina-single", "ina-root"):
        if collective == "ina-root" and len(per_switch) != len(switches):
            raise ValueError("ina-root needs the job's GPUs under each of its switches")
        links = tree_links(switches, route, collective != "ina", per_switch if collective == "ina-root" else ())
        # one step: each GPU streams its gradient up while the sums stream down (full duplex)
        return TreeRing(ring.key, ring.compute_s, ring.busy_s, ring.n, ring.gradient_bytes, ring.cap, links,
                        ring.coarse, phase_steps=1, phase_bytes=ring.gradient_bytes)
    return ring


# --- policies and the run --------------------------------------------------------------------
@dataclass(frozen=True)
class NeighbourPolicy(Policy):
    fabric: str = ""  # oddl | topoopt | sipml ("" the rack's)
    collective: str = "ring"  # ring | ina | ina-single | ina-root
    sharing: str = ""  # mltcp ("" the network's: max-min fair, or held)
    params: Params = field(default_factory=Params)


def policies(p: Params | None = None) -> dict[str, NeighbourPolicy]:
    """The neighbours as policies of `optirack simulate --policies` (beside engine.policies)."""
    p = p or Params()
    return {q.name: q for q in (
        NeighbourPolicy("oddl", "fixed", label="ODDL: all-optical 2-D WSS, a circuit per flow", fabric="oddl",
                        params=p),
        NeighbourPolicy("panama", "regroup", label="regroup + in-network aggregation (PANAMA)", collective="ina",
                        params=p),
        NeighbourPolicy("switchml", "regroup", label="regroup + single-tree aggregation (SwitchML-like)",
                        collective="ina-single", params=p),
        NeighbourPolicy("mltcp", "regroup", label="regroup + MLTCP: shares weighted by bytes sent", sharing="mltcp",
                        params=p),
        NeighbourPolicy("topoopt", "fixed", label="TopoOpt-like: per-job topology, parallel rings",
                        fabric="topoopt", params=p),
        NeighbourPolicy("sipml", "fixed", label="SiP-ML-like: all-optical, Tbit/s per GPU", fabric="sipml",
                        params=p),
    )}


class NeighbourRun(Run):
    """The engine's run with a neighbour's fabric or collective (simulator/model/engine.py is the model of record
    for the paper's cases: the neighbours live beside it, not in it)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.node = {g: i for i, g in enumerate(self.rack.gpus)}  # a GPU's node on ODDL's grid
        self.side = oddl_side(len(self.node))
        self._one_shot = False
        # MLTCP: its shares where rings transfer together; held shares (--sharing held) stay held, as the network's
        self.mltcp = None
        if self.policy.sharing == "mltcp" and not self.inter.held:
            p = self.policy.params
            self.inter = self.mltcp = MltcpInterference(self.inter, p.mltcp_slope, p.mltcp_levels)

    def run(self):
        out = super().run()
        if self.mltcp is not None:  # which shared rings MLTCP could change, and what bounded them (mltcp_gain)
            why: dict[str, list[str]] = {"busy": [], "periods": [], "other": []}
            for k, reason in sorted(self.mltcp.why.items()):
                why[reason].append(self.jobs[k].id)
            out.stats["mltcp"] = {**why, "mean_field": sorted(self.jobs[k].id for k in self.mltcp.mean)}
        return out

    def _attempt(self, t, key):
        self._one_shot = self.policy.fabric == "topoopt" and self.jobs[key].gpus > 1
        return super()._attempt(t, key)

    def _reconfigure(self, t: float, diff: CircuitDiff) -> float:
        ready = super()._reconfigure(t, diff)
        if self._one_shot:  # TopoOpt-like: the job's own topology, one OCS change when it is placed
            self._one_shot = False
            ready += max(o.bulk_time_ms for o in self.rack.ocs.values()) / 1000 + self.o.control_overhead_s
        return ready

    def _ring(self, key: int) -> Ring:
        ring = super()._ring(key)
        pol = self.policy
        gpus = self.placer.gpus[self.jobs[key].id]
        where = self.placer.switch_of(gpus)
        switches = list(dict.fromkeys(where[g] for g in gpus))
        return adapt(ring, pol.fabric, pol.collective, pol.params, self.o.net.efficiency,
                     nodes=[self.node[g] for g in gpus], side=self.side, switches=switches, route=self.fabric.route,
                     per_switch=[sum(where[g] == s for g in gpus) for s in switches]
                     if pol.collective == "ina-root" else ())


def run_class(policy: Policy) -> type[Run]:
    return NeighbourRun if isinstance(policy, NeighbourPolicy) else Run


# --- MLTCP against regroup: what it saved, and why not -------------------------------------------
def mltcp_gain(fair: RunResult, mltcp: RunResult) -> dict:
    """The jobs that shared a link under regroup (fair shares), placed alike under MLTCP: their completion times
    (as simulator.studies.metrics.timeshift_gain), and for each what bounded MLTCP (the run's stats["mltcp"])."""
    gain = metrics.timeshift_gain(fair, mltcp)
    for key in ("shifted", "fit", "first", "no_better"):
        gain.pop(key, None)
    stats = mltcp.stats.get("mltcp")
    gain["held"] = stats is None
    if stats is None or not gain["jobs"]:
        return gain
    ids = set(gain["ids"])
    for reason in ("busy", "periods", "other", "mean_field"):
        gain[reason] = len(ids & set(stats[reason]))
    gain["fit"] = gain["jobs"] - sum(gain[r] for r in ("busy", "periods", "other", "mean_field"))
    return gain


def mltcp_text(g: dict) -> str:
    """One paragraph: MLTCP's gain over regroup for the jobs that shared, and where it saved nothing, why."""
    if g.get("held"):
        return ("MLTCP: not applied: shares are held (--sharing held): a ring keeps its share of a link whatever it "
                "has sent, so MLTCP ran as regroup.")
    if not g.get("jobs"):
        return ("MLTCP: no job shared a link under regroup with the same placement in both runs, so shares never "
                "mattered.")
    n = g["jobs"]
    text = (f"MLTCP: {n} jobs shared an uplink under regroup and were placed alike with MLTCP; their mean completion "
            f"time went from {g['jct_unshifted_s']:,.1f} s to {g['jct_shifted_s']:,.1f} s "
            f"(**{abs(100 * g['saved']):.1f} % {'sooner' if g['saved'] >= 0 else 'later'}**; "
            f"mean iteration {1e3 * g['iteration_unshifted_s']:.1f} ms → "
            f"{1e3 * g['iteration_shifted_s']:.1f} ms; {g['faster']} of {n} finished sooner).")
    if g["saved"] > 0.0005:
        return text
    why = []
    if g["fit"]:
        why.append(f"for {g['fit']} of {n} the rings' summed peak demand fit every link they shared, so no share ever "
                   "bound them and unequal shares change nothing")
    if g["busy"]:
        why.append(f"{g['busy']} shared a link whose traffic, every ring at its pace alone, fills more than all its "
                   "time (their communication's shares of an iteration sum past 100 %): there is no pause to "
                   "interleave into, unequal shares only move who waits")
    if g["periods"]:
        why.append(f"{g['periods']} shared with rings whose iterations alone differ, so an interleaving does not "
                   "hold: they drift back into overlap")
    if g["mean_field"]:
        why.append(f"{g['mean_field']} were in groups of rings too large to step through (mean field: fair shares, "
                   "MLTCP not modelled)")
    if g["other"]:
        why.append(f"{g['other']} contended and could interleave, but what MLTCP won in later iterations the "
                   "transient's cost (or the run's end) took back")
    return text + " MLTCP saved nothing: " + "; ".join(why) + "."


# --- the CLI's flags (optirack simulate) --------------------------------------------------------
def add_arguments(parser) -> None:
    g = parser.add_argument_group("the neighbours' fabrics (policies oddl, topoopt, sipml, panama, switchml, mltcp)")
    d = Params()
    g.add_argument("--oddl-switch-ns", type=float, default=d.oddl_switch_s * 1e9,
                   help="ODDL: wavelength switching per circuit, ns (%(default)s, the paper's measured)")
    g.add_argument("--oddl-control-us", type=float, default=d.oddl_control_s * 1e6,
                   help="ODDL: distributed control's overhead per flow, us (%(default)s, assumed)")
    g.add_argument("--topoopt-degree", type=int, default=d.topoopt_degree,
                   help="TopoOpt-like: NICs per GPU, parallel rings (%(default)s, assumed)")
    g.add_argument("--sipml-gbps", type=float, default=d.sipml_gbps,
                   help="SiP-ML-like: Gbit/s per GPU (%(default)s, assumed)")
    g.add_argument("--sipml-setup-us", type=float, default=d.sipml_setup_s * 1e6,
                   help="SiP-ML-like: circuit set-up per ring step, us (%(default)s)")
    g.add_argument("--mltcp-slope", type=float, default=d.mltcp_slope,
                   help="MLTCP: a transferring ring's weight is 1 + slope x its iteration's bytes sent, as a share "
                        "(%(default)s, assumed)")


def from_args(args) -> Params:
    p = Params(args.oddl_switch_ns * 1e-9, args.oddl_control_us * 1e-6, args.topoopt_degree, args.sipml_gbps,
               args.sipml_setup_us * 1e-6, args.mltcp_slope)
    p.check()
    return p
