"""The OCS circuit map: which OCS ports are joined, its validation against the rack, and diffs."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from controller.core.cabling import CircuitError, check_circuits
from controller.core.rack import PortRef, Rack, _port_ref

Circuit = tuple[PortRef, PortRef]  # always (lower, higher)


def normalize(a: PortRef, b: PortRef) -> Circuit:
    return (a, b) if a < b else (b, a)


@dataclass(frozen=True)
class CircuitDiff:
    remove: frozenset[Circuit]
    add: frozenset[Circuit]

    def __bool__(self) -> bool:
        return bool(self.remove or self.add)

    def ports(self) -> set[PortRef]:
        return {p for c in self.remove | self.add for p in c}

    def by_ocs(self) -> dict[str, CircuitDiff]:
        names = {c[0].device for c in self.remove | self.add}
        return {o: CircuitDiff(frozenset(c for c in self.remove if c[0].device == o),
                               frozenset(c for c in self.add if c[0].device == o)) for o in sorted(names)}


class CircuitMap:
    """An immutable, validated set of circuits over a rack's OCS."""

    def __init__(self, circuits: Iterable[Circuit] = ()):
        self.circuits: frozenset[Circuit] = frozenset(normalize(a, b) for a, b in circuits)
        self._partner = {}
        for a, b in self.circuits:
            self._partner[a], self._partner[b] = b, a

    @classmethod
    def initial(cls, rack: Rack) -> CircuitMap:
        return cls(rack.spec.circuits)

    @classmethod
    def parse(cls, rack: Rack, items: object, field: str = "circuits") -> CircuitMap:
        """Validate a request body's list of ``["ocs1:1", "ocs1:11"]`` pairs against the rack."""
        if not isinstance(items, list):
            raise CircuitError(field, "expected a list of [port, port] pairs")
        pairs = []
        for i, item in enumerate(items):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise CircuitError(f"{field}[{i}]", "expected a pair of ports like [\"ocs1:1\", \"ocs1:11\"]")
            try:
                a, b = (_port_ref(x) for x in item)
                pairs.append((a, b))
            except ValueError as e:
                raise CircuitError(f"{field}[{i}]", str(e)) from None
        check_circuits(rack, pairs, field)
        return cls(pairs)

    def partner(self, ref: PortRef) -> PortRef | None:
        return self._partner.get(ref)

    def gpu_locations(self, rack: Rack) -> dict[str, tuple[str, int]]:
        """GPU name -> (switch, switch port) for every GPU whose NIC has a circuit."""
        result = {}
        for name in rack.gpus:
            other = self.partner(rack.gpu_port(name))
            ep = rack.endpoints.get(other) if other else None
            if ep and ep.kind == "switch":
                result[name] = (ep.name, ep.port)
        return result

    def diff(self, target: CircuitMap) -> CircuitDiff:
        return CircuitDiff(self.circuits - target.circuits, target.circuits - self.circuits)

    def apply(self, diff: CircuitDiff) -> CircuitMap:
        return CircuitMap((self.circuits - diff.remove) | diff.add)

    def on(self, ocs: str) -> frozenset[Circuit]:
        return frozenset(c for c in self.circuits if c[0].device == ocs)

    def to_json(self) -> list[list[str]]:
        """Sorted pairs of "ocs:port" (the order of PortRef, keyed as tuples: much faster to sort)."""
        key = lambda c: (c[0].device, c[0].port, c[1].device, c[1].port)  # noqa: E731
        return [[f"{a.device}:{a.port}", f"{b.device}:{b.port}"] for a, b in sorted(self.circuits, key=key)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CircuitMap) and self.circuits == other.circuits

    def __hash__(self) -> int:
        return hash(self.circuits)

    def __len__(self) -> int:
        return len(self.circuits)

    def __repr__(self) -> str:
        return f"CircuitMap({self.to_json()})"


def displaced(rack: Rack, diff: CircuitDiff, own: Iterable[str]) -> list[str]:
    """What a job's change did to GPUs outside the job (`own`): one line per circuit of another GPU
    it removed, e.g. "moved gpu6's circuit ocs1:6-ocs1:12"."""
    own = set(own)
    lines = []
    for a, b in sorted(diff.remove):
        for ref in (a, b):
            ep = rack.endpoints.get(ref)
            if ep is not None and ep.kind == "gpu" and ep.name not in own:
                lines.append(f"moved {ep.name}'s circuit {a}-{b}")
    return lines


class Changes:
    """For a plan with `remove` and `add` circuit sets: how many circuits change, and the diff."""

    remove: frozenset[Circuit]
    add: frozenset[Circuit]

    @property
    def changes(self) -> int:
        return len(self.remove) + len(self.add)

    @property
    def diff(self) -> CircuitDiff:
        return CircuitDiff(self.remove, self.add)
