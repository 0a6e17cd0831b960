"""Short flows beside aggregation traffic: PANAMA's large-scale figure (seed 002, slide 20), as a model.

The fabric: a two-tier leaf-spine tree, `leaves` x `hosts` servers, every leaf on every spine (full
bisection). Aggregation jobs of `job_hosts` servers each, spread over `job_leaves` leaves at random, repeat
compute and communication; the aggregation traffic load `load` is the share of a server's link one
gradient per iteration takes (what in-network aggregation sends). A collective sets which links a job's
traffic crosses, for what share of the time, and what queue it keeps at a port while it sends:

- `ring-tcp` / `ring-ecn`: ring all-reduce: every server sends 2(m-1)/m gradients per iteration, so its flows
  are active min(1, 2(m-1)/m x load) of the time; the ring crosses from leaf to leaf once per leaf, each
  crossing hashed to one spine (ECMP). Over loss-based TCP its flows fill the port's buffer while they send;
  over an ECN-marking transport they keep the marking threshold queued (shared by all such flows).
- `switchml`: SwitchML-like aggregation, augmented with load balancing as the slide's curve is: each leaf
  sends one stream per job, its parts over every spine, active `load` of the time; no congestion control, so
  each stream keeps its whole window of aggregation slots queued at a port, whatever else is there.
- `panama`: PANAMA: the same streams over aggregation trees rooted at every spine, under a congestion
  control that shares links with other flows (ECN-marking: the threshold queued).
- `ideal`: the short flows see no aggregation traffic (the slide's lower bound).

A short flow (7 kB, between servers under different leaves) arrives at a random instant; at that instant
each aggregation flow on its path is active with its duty cycle. Its completion time: the base round trip,
the queue it waits behind at each hop (at most the buffer), and its bytes at its share of the bottleneck
(the line rate over the active flows + 1). The 99th percentile over `samples` flows. The transports'
queues are assumptions (Fabric), and they set the order of the curves: see docs/neighbour-panama.md.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

COLLECTIVES = ("ring-tcp", "ring-ecn", "switchml", "panama", "ideal")
FILL, ECN, WINDOW = "fill", "ecn", "window"  # an active long flow keeps queued: the buffer, the threshold, its window


@dataclass(frozen=True)
class Fabric:
    leaves: int = 32
    hosts: int = 32  # servers per leaf: 1,024 in all, as the slide's fat tree
    spines: int = 8
    gbps: float = 100.0  # a server's link; a leaf's uplinks carry hosts x gbps over the spines
    rtt_s: float = 10e-6  # base round trip: assumed
    ecn_bytes: float = 30e3  # an ECN-marking transport's queue at a port (the marking threshold): assumed
    window_bytes: float = 128e3  # a SwitchML-like stream's window of aggregation slots: assumed
    buffer_bytes: float = 2e6  # a port's buffer, which loss-based TCP fills: assumed
    short_bytes: float = 7e3  # the slide's short flows
    job_hosts: int = 16
    job_leaves: int = 4


def hop_delay(fab: Fabric, rate_bps: float, kinds: list[str]) -> float:
    """Queueing delay at one hop for the active long flows of `kinds`."""
    if FILL in kinds:
        queued = fab.buffer_bytes
    else:
        queued = min(fab.buffer_bytes, fab.ecn_bytes * (ECN in kinds) + fab.window_bytes * kinds.count(WINDOW))
    return queued * 8 / rate_bps


def fct(fab: Fabric, hops: list[tuple[float, list[str]]]) -> float:
    """A short flow's completion time over `hops`: (link rate bit/s, the kinds of its active long flows) each."""
    wait, share = 0.0, float("inf")
    for rate, kinds in hops:
        wait += hop_delay(fab, rate, kinds)
        share = min(share, rate / (len(kinds) + 1))
    return fab.rtt_s + wait + fab.short_bytes * 8 / share


def _jobs(fab: Fabric, rng: random.Random) -> list[list[tuple[int, int]]]:
    """Every job's servers as (leaf, host), job_leaves leaves each, every server in one job."""
    free = {leaf: list(range(fab.hosts)) for leaf in range(fab.leaves)}
    jobs, per = [], fab.job_hosts // fab.job_leaves
    while True:
        leaves = [leaf for leaf in free if len(free[leaf]) >= per]
        if len(leaves) < fab.job_leaves:
            return jobs
        chosen = rng.sample(leaves, fab.job_leaves)
        jobs.append([(leaf, free[leaf].pop()) for leaf in chosen for _ in range(per)])


def p99(fab: Fabric, collective: str, load: float, samples: int = 20000, seed: int = 1) -> float:
    """The short flows' 99th-percentile completion time at aggregation load `load`."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, not {collective!r}")
    rng = random.Random(seed)
    jobs = _jobs(fab, rng)
    m = fab.job_hosts
    # per link: [(duty, kind)] of the long flows crossing it; links: ("up"|"down", leaf, spine) and host links
    flows: dict[tuple, list[tuple[float, str]]] = {}
    host_of: dict[tuple[int, int], int] = {}
    for j, job in enumerate(jobs):
        for server in job:
            host_of[server] = j
        if collective == "ideal":
            continue
        leaves = sorted({leaf for leaf, _ in job})
        if collective.startswith("ring"):
            duty, kind = min(1.0, 2 * (m - 1) / m * load), FILL if collective == "ring-tcp" else ECN
            for server in job:  # each server's ring flow out and the one in
                flows.setdefault(("host", server), []).append((duty, kind))
            for i, leaf in enumerate(leaves):  # the crossing from this leaf to the next, on one spine
                nxt, spine = leaves[(i + 1) % len(leaves)], rng.randrange(fab.spines)
                flows.setdefault(("up", leaf, spine), []).append((duty, kind))
                flows.setdefault(("down", nxt, spine), []).append((duty, kind))
        else:
            kind = ECN if collective == "panama" else WINDOW
            for server in job:
                flows.setdefault(("host", server), []).append((load, kind))
            for leaf in leaves:  # the leaf's stream, a part over every spine, and the sums back
                for spine in range(fab.spines):
                    flows.setdefault(("up", leaf, spine), []).append((load, kind))
                    flows.setdefault(("down", leaf, spine), []).append((load, kind))
    uplink = fab.hosts * fab.gbps * 1e9 / fab.spines
    host = fab.gbps * 1e9
    servers = list(host_of)
    out = []
    for _ in range(samples):
        a = rng.choice(servers)
        b = rng.choice([s for s in (rng.choice(servers) for _ in range(4)) if s[0] != a[0]] or [servers[0]])
        spine = rng.randrange(fab.spines)
        path = [(("host", a), host), (("up", a[0], spine), uplink), (("down", b[0], spine), uplink),
                (("host", b), host)]
        hops = []
        for link, rate in path:
            hops.append((rate, [kind for duty, kind in flows.get(link, ()) if rng.random() < duty]))
        out.append(fct(fab, hops))
    out.sort()
    return out[int(0.99 * (len(out) - 1))]


def figure(loads=(0.01, 0.2, 0.4, 0.6, 0.8), fab: Fabric = Fabric(), samples: int = 20000) -> dict:
    return {"loads": list(loads), "fabric": vars(fab),
            "p99_s": {c: [p99(fab, c, x, samples) for x in loads] for c in COLLECTIVES}}
