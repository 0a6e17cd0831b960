"""A first-order model of a synchronous ring all-reduce job's iteration time on a rack, for predicting
what a regrouping gains before it is made.

Iteration = compute (the slowest GPU's, from profiles/__init__.py) + ring all-reduce of the
model's gradients, 2(n-1)/n x S / B. B is the ring's slowest hop: a NIC's rate, or an uplink's
rate shared by every ring hop (of every job) that crosses it in the same direction. It assumes
the jobs' all-reduce phases overlap, so it is an upper bound on what contention costs and on
what regrouping saves; latency is ignored.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from controller.core.placement import seconds_per_iteration
from controller.core.rack import Rack
from profiles import WORKLOADS


def switch_routes(rack: Rack) -> dict[str, dict[str, list[str]]]:
    """src switch -> dst switch -> the switches a packet crosses (breadth first over the uplinks)."""
    links: dict[str, list[str]] = {w: [] for w in rack.switches}
    for w in rack.spec.switches:
        for u in sorted(w.uplinks, key=lambda u: u.port):
            if u.peer.device not in links[w.name]:
                links[w.name].append(u.peer.device)
    routes: dict[str, dict[str, list[str]]] = {}
    for src in links:
        prev: dict[str, str | None] = {src: None}
        queue = deque([src])
        while queue:
            s = queue.popleft()
            for n in links[s]:
                if n not in prev:
                    prev[n] = s
                    queue.append(n)
        routes[src] = {}
        for dst in prev:
            path: list[str] = []
            at: str | None = dst
            while at is not None:
                path.append(at)
                at = prev[at]
            routes[src][dst] = path[::-1]
    return routes


def _link_rates(rack: Rack) -> dict[tuple[str, str], float]:
    rates: dict[tuple[str, str], float] = {}
    for w in rack.spec.switches:
        for u in sorted(w.uplinks, key=lambda u: u.port):
            rates.setdefault((w.name, u.peer.device), u.rate_gbps)
    return rates


def iteration_seconds(rack: Rack, jobs: Mapping[str, Sequence[str]], where: Mapping[str, str | None],
                      workloads: Mapping[str, str]) -> dict[str, float]:
    """Each job's predicted seconds per iteration, given its GPUs in rank order and each GPU's switch."""
    routes, rates = switch_routes(rack), _link_rates(rack)
    hops: dict[str, list[tuple[str, str, list[tuple[str, str]]]]] = {}
    load: dict[tuple[str, str], int] = {}
    for job, gpus in jobs.items():
        ring = []
        for a, b in zip(gpus, list(gpus[1:]) + list(gpus[:1]), strict=True):
            sa, sb = where.get(a), where.get(b)
            path = routes.get(sa, {}).get(sb, []) if sa and sb else []
            links = list(zip(path, path[1:], strict=False))
            for link in links:
                load[link] = load.get(link, 0) + 1
            ring.append((a, b, links))
        hops[job] = ring if len(gpus) > 1 else []
    result = {}
    for job, gpus in jobs.items():
        workload = workloads.get(job, "vgg16")
        compute = max(seconds_per_iteration(workload, rack.gpus[g].model) for g in gpus)
        if not hops[job]:
            result[job] = compute
            continue
        gbps = min(min(rack.gpus[a].nic.rate_gbps, rack.gpus[b].nic.rate_gbps,
                       *(rates[link] / load[link] for link in links)) for a, b, links in hops[job])
        size = WORKLOADS[workload].gradient_bytes if workload in WORKLOADS else 0
        n = len(gpus)
        result[job] = compute + 2 * (n - 1) / n * size * 8 / (gbps * 1e9)
    return result
