"""Integer ids for a rack's ports, GPUs, aggregator switches, GPU models and (OCS, line rate) groups, built once per
`Rack` and cached: what controller/core/occupancy.py's indices are indexed by."""
from __future__ import annotations

import weakref

from controller.core.circuits import Circuit, normalize
from controller.core.rack import PortRef, Rack


class RackIndex:
    """Integer ids for a rack's ports, GPUs, aggregator switches, models and (OCS, rate) groups."""

    def __init__(self, rack: Rack):
        self.rack = rack
        self.ports: list[PortRef] = list(rack.endpoints)
        self.port_id = {p: i for i, p in enumerate(self.ports)}
        self.gpus: list[str] = list(rack.gpus)
        self.gpu_id = {g: i for i, g in enumerate(self.gpus)}
        self.switches: list[str] = rack.aggregators()
        self.switch_id = {w: i for i, w in enumerate(self.switches)}
        self.models: list[str] = list(dict.fromkeys(g.model for g in rack.gpus.values()))
        self.model_id = {m: i for i, m in enumerate(self.models)}
        groups: dict[tuple[str, float], int] = {}
        for ref, ep in rack.endpoints.items():
            groups.setdefault((ref.device, ep.rate_gbps), len(groups))
        self.groups: list[tuple[str, float]] = list(groups)
        n = len(self.ports)
        self.port_gpu, self.port_switch, self.port_group = [-1] * n, [-1] * n, [0] * n
        self.switch_port = [0] * n  # the switch's own port number of a downlink
        for i, ref in enumerate(self.ports):
            ep = rack.endpoints[ref]
            self.port_group[i] = groups[(ref.device, ep.rate_gbps)]
            if ep.kind == "gpu":
                self.port_gpu[i] = self.gpu_id[ep.name]
            elif ep.name in self.switch_id:
                self.port_switch[i], self.switch_port[i] = self.switch_id[ep.name], ep.port
        self.gpu_port = [self.port_id[rack.gpu_port(g)] for g in self.gpus]
        self.gpu_group = [self.port_group[p] for p in self.gpu_port]
        self.gpu_model = [self.model_id[rack.gpus[g].model] for g in self.gpus]
        self.downlinks: list[list[list[int]]] = [[[] for _ in self.groups] for _ in self.switches]  # [switch][group]
        for i in sorted(range(n), key=lambda i: self.switch_port[i]):
            if self.port_switch[i] >= 0:
                self.downlinks[self.port_switch[i]][self.port_group[i]].append(i)
        self.model_count = [self.gpu_model.count(m) for m in range(len(self.models))]
        self.group_width = [max(len(per[g]) for per in self.downlinks) for g in range(len(self.groups))]  # downlinks

    def circuit(self, a: int, b: int) -> Circuit:
        return normalize(self.ports[a], self.ports[b])


_INDEXES: weakref.WeakKeyDictionary[Rack, RackIndex] = weakref.WeakKeyDictionary()


def index_of(rack: Rack) -> RackIndex:
    """The rack's index, built on first use."""
    ix = _INDEXES.get(rack)
    if ix is None:
        ix = _INDEXES[rack] = RackIndex(rack)
    return ix
