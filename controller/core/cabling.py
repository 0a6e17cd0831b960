"""Whether a set of circuits is one an OCS can hold on this rack's cabling: the check a rack file's starting circuits
and every requested circuit map pass. It reads the rack (its OCS and what is cabled to their ports) and imports
nothing of core, so that the rack model (rack.py) and the circuit map (circuits.py) can both use it."""

from __future__ import annotations


class CircuitError(ValueError):
    """A circuit request that cannot be applied; `field` names the offending part."""

    def __init__(self, field: str, problem: str):
        self.field, self.problem = field, problem
        super().__init__(f"{field}: {problem}")


def check_circuits(rack, pairs: list[tuple], field: str = "circuits") -> None:
    """Raise CircuitError unless every pair joins a GPU NIC and a switch downlink of equal rate on one OCS."""
    used: dict = {}  # port -> index of the circuit that uses it
    for i, (a, b) in enumerate(pairs):
        where = f"{field}[{i}]"
        for ref in (a, b):
            ocs = rack.ocs.get(ref.device)
            if ocs is None:
                raise CircuitError(where, f"{ref}: no OCS named {ref.device!r}")
            if ref.port > ocs.ports:
                raise CircuitError(where, f"{ref}: OCS {ref.device} has only {ocs.ports} ports")
            if ref not in rack.endpoints:
                raise CircuitError(where, f"{ref}: nothing is cabled to this OCS port")
            if ref in used:
                raise CircuitError(where, f"{ref} is already used by {field}[{used[ref]}]")
            used[ref] = i
        if a.device != b.device:
            raise CircuitError(where, f"{a} and {b} are on different OCS")
        ea, eb = rack.endpoints[a], rack.endpoints[b]
        if {ea.kind, eb.kind} != {"gpu", "switch"}:
            kinds = " to ".join("GPU NIC" if e.kind == "gpu" else "switch port" for e in (ea, eb))
            raise CircuitError(where, f"{a} - {b} would join {kinds}; a circuit joins a GPU NIC and a switch downlink")
        if ea.rate_gbps != eb.rate_gbps:
            raise CircuitError(where, f"{a} runs at {ea.rate_gbps:g} Gbit/s and {b} at {eb.rate_gbps:g} Gbit/s")
