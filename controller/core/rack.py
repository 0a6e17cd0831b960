"""The rack file: one YAML document that describes a rack, validated into typed, frozen objects.

Structure and types are checked by pydantic; references between devices (cabling, uplinks,
circuits) by `_check_references`. Every problem is reported as a `RackError` naming the file,
the field (e.g. ``servers[0].gpus[1].nic.rate_gbps``) and what is wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal, Optional, Union

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from controller.core.cabling import CircuitError, check_circuits
from controller.core.rackspec import (  # noqa: F401 (the rack file's names, as core has always given them)
    MAX_PORTS,
    NAME_PATTERN,
    Downlink,
    Emulation,
    Engines,
    Gpu,
    Network,
    Nic,
    Ocs,
    PortRef,
    RackError,
    RackSpec,
    Server,
    Switch,
    Tls,
    Uplink,
    _port_ref,
)
from profiles import GPU_MODELS


@dataclass(frozen=True)
class Endpoint:
    """What is cabled to one OCS port: a GPU's NIC or a switch downlink."""

    kind: Literal["gpu", "switch"]
    name: str  # GPU name or switch name
    port: int = 0  # switch port number (switch endpoints)
    rate_gbps: float = 0.0


class Rack:
    """A validated rack with the look-ups the controller and the emulation need."""

    def __init__(self, spec: RackSpec, source: str = "<rack>"):
        self.spec, self.source = spec, source
        self.servers = {s.name: s for s in spec.servers}
        self.gpus = {g.name: g for s in spec.servers for g in s.gpus}
        self.server_of = {g.name: s.name for s in spec.servers for g in s.gpus}
        self.ocs = {o.name: o for o in spec.ocs}
        self.switches = {s.name: s for s in spec.switches}
        self.endpoints: dict[PortRef, Endpoint] = {}
        for g in self.gpus.values():
            self.endpoints[g.nic.ocs_port] = Endpoint("gpu", g.name, 0, g.nic.rate_gbps)
        for sw in spec.switches:
            for d in sw.downlinks:
                self.endpoints[d.ocs_port] = Endpoint("switch", sw.name, d.port, d.rate_gbps)

    @property
    def name(self) -> str:
        return self.spec.name

    @cached_property
    def addresses(self) -> dict[str, tuple[str, str]]:
        """GPU name -> (IPv4 address, MAC address) of its NIC."""
        hosts = self.spec.network.subnet.hosts()
        taken = {g.nic.ip for g in self.gpus.values() if g.nic.ip}
        result = {}
        for name, g in self.gpus.items():
            ip = g.nic.ip
            if ip is None:
                ip = next(h for h in hosts if h not in taken)
                taken.add(ip)
            mac = g.nic.mac or "02:00:" + ":".join(f"{b:02x}" for b in ip.packed)
            result[name] = (str(ip), mac)
        return result

    def engine_host(self, server: str) -> str | None:
        """The address in a server's tcp:// or ssh:// engine URL (None for a local engine)."""
        url = self.servers[server].docker
        return None if url == "local" else url.split("://", 1)[1].split("@")[-1].rsplit(":", 1)[0]

    def interface(self, gpu: str) -> str:
        """The interface name of a GPU's NIC."""
        return self.gpus[gpu].nic.interface or gpu

    def gpu_port(self, gpu: str) -> PortRef:
        return self.gpus[gpu].nic.ocs_port

    def gpu_at(self, ref: PortRef) -> Optional[str]:
        ep = self.endpoints.get(ref)
        return ep.name if ep and ep.kind == "gpu" else None

    def downlink_ports(self, switch: str) -> list[PortRef]:
        return [d.ocs_port for d in self.switches[switch].downlinks]

    def aggregators(self) -> list[str]:
        return [s.name for s in self.spec.switches if s.role == "aggregator"]

    def datapaths(self) -> dict[int, tuple[str, str]]:
        """dpid -> (kind 'ocs' or 'switch', name)."""
        result = {o.dpid: ("ocs", o.name) for o in self.spec.ocs}
        result.update({s.dpid: ("switch", s.name) for s in self.spec.switches})
        return result

    def summary(self) -> str:
        s = self.spec
        models: dict[str, int] = {}
        for g in self.gpus.values():
            models[g.model] = models.get(g.model, 0) + 1
        gpu_text = ", ".join(f"{n} x {m}" for m, n in sorted(models.items()))
        lines = [
            f"rack {s.name}: {len(s.servers)} servers, {len(self.gpus)} GPUs ({gpu_text})",
            "  OCS: "
            + ", ".join(f"{o.name} ({o.ports} ports, {o.switching_time_ms:g} ms switching, {o.driver})" for o in s.ocs),
            "  switches: "
            + ", ".join(f"{w.name} ({w.role}, {len(w.downlinks)} down, {len(w.uplinks)} up)" for w in s.switches),
            f"  circuits: {len(s.circuits)}; emulation rate scale {s.emulation.rate_scale:g}, "
            f"time dilation {s.emulation.time_dilation:g}"
            f" (100 Gbit/s -> {s.emulation.mbps(100):g} Mbit/s); subnet {s.network.subnet}",
        ]
        return "\n".join(lines)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _pydantic_message(err: ErrorDetails) -> str:
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err["type"] == "string_pattern_mismatch" and str(err["loc"][-1]) == "name":
        msg = f"{err['input']!r} is not a valid name (lower-case letter, then up to 8 letters or digits)"
    return msg


def _check_unique_names(spec: RackSpec, src: str) -> None:
    seen: dict[str, str] = {}
    named: list[tuple[str, Server | Gpu | Ocs | Switch]] = [(f"servers[{i}]", s) for i, s in enumerate(spec.servers)]
    named += [(f"servers[{i}].gpus[{j}]", g) for i, s in enumerate(spec.servers) for j, g in enumerate(s.gpus)]
    named += [(f"ocs[{i}]", o) for i, o in enumerate(spec.ocs)]
    named += [(f"switches[{i}]", w) for i, w in enumerate(spec.switches)]
    for field, obj in named:
        if obj.name in seen:
            raise RackError(src, f"{field}.name", f"duplicate name {obj.name!r} (also {seen[obj.name]})")
        seen[obj.name] = field
    dpids: dict[int, str] = {}
    datapaths: list[tuple[str, Ocs | Switch]] = [(f"ocs[{i}]", o) for i, o in enumerate(spec.ocs)]
    datapaths += [(f"switches[{i}]", w) for i, w in enumerate(spec.switches)]
    for field, dp in datapaths:
        if dp.dpid in dpids:
            raise RackError(src, f"{field}.dpid", f"duplicate datapath id {dp.dpid:#x} (also {dpids[dp.dpid]})")
        dpids[dp.dpid] = field


def _check_ocs_port(spec: RackSpec, src: str, field: str, ref: PortRef) -> None:
    ocs = {o.name: o for o in spec.ocs}
    if ref.device not in ocs:
        raise RackError(src, field, f"{ref}: no OCS named {ref.device!r} (OCS: {', '.join(ocs)})")
    if ref.port > ocs[ref.device].ports:
        raise RackError(src, field, f"{ref}: OCS {ref.device} has only {ocs[ref.device].ports} ports")


def _check_cabling(spec: RackSpec, src: str) -> None:
    cabled: dict[PortRef, str] = {}

    def cable(field: str, ref: PortRef) -> None:
        _check_ocs_port(spec, src, field, ref)
        if ref in cabled:
            raise RackError(src, field, f"OCS port {ref} is cabled twice (also {cabled[ref]})")
        cabled[ref] = field

    for i, s in enumerate(spec.servers):
        indexes: set[int] = set()
        interfaces: set[str] = set()
        for j, g in enumerate(s.gpus):
            field = f"servers[{i}].gpus[{j}]"
            ifname = g.nic.interface or g.name
            if ifname in interfaces:
                raise RackError(src, f"{field}.nic.interface", f"interface {ifname!r} is used twice on server {s.name}")
            interfaces.add(ifname)
            if g.model not in GPU_MODELS:
                raise RackError(
                    src, f"{field}.model", f"unknown GPU model {g.model!r} (known: {', '.join(GPU_MODELS)})"
                )
            if g.index in indexes:
                raise RackError(src, f"{field}.index", f"GPU index {g.index} is used twice on server {s.name}")
            indexes.add(g.index)
            if g.nic.ip is not None and g.nic.ip not in spec.network.subnet:
                raise RackError(src, f"{field}.nic.ip", f"{g.nic.ip} is outside network.subnet {spec.network.subnet}")
            cable(f"{field}.nic.ocs_port", g.nic.ocs_port)
    for i, w in enumerate(spec.switches):
        ports: set[int] = set()
        if w.role == "core" and w.downlinks:
            raise RackError(src, f"switches[{i}].downlinks", "a core switch has no OCS downlinks")
        links: list[tuple[str, int, Downlink | Uplink]] = [("downlinks", j, d) for j, d in enumerate(w.downlinks)]
        links += [("uplinks", j, u) for j, u in enumerate(w.uplinks)]
        for kind, j, link in links:
            if link.port in ports:
                raise RackError(src, f"switches[{i}].{kind}[{j}].port", f"port {link.port} of {w.name} is used twice")
            ports.add(link.port)
            if isinstance(link, Downlink):
                cable(f"switches[{i}].downlinks[{j}].ocs_port", link.ocs_port)


def _check_uplinks(spec: RackSpec, src: str) -> None:
    switches = {w.name: w for w in spec.switches}
    for i, w in enumerate(spec.switches):
        for j, up in enumerate(w.uplinks):
            field = f"switches[{i}].uplinks[{j}].peer"
            peer = switches.get(up.peer.device)
            if peer is None or peer.name == w.name:
                raise RackError(src, field, f"{up.peer}: no other switch named {up.peer.device!r}")
            back = [u for u in peer.uplinks if u.port == up.peer.port]
            if not back or back[0].peer != PortRef(w.name, up.port):
                raise RackError(src, field, f"{up.peer} does not name {w.name}:{up.port} as its peer")
            if back[0].rate_gbps != up.rate_gbps:
                raise RackError(
                    src, f"switches[{i}].uplinks[{j}].rate_gbps", f"differs from the rate of its peer {up.peer}"
                )


def _check_circuits(spec: RackSpec, src: str, rack: Rack) -> None:
    try:
        check_circuits(rack, list(spec.circuits))
    except CircuitError as e:
        raise RackError(src, e.field, e.problem) from None


def _check_addresses(rack: Rack, src: str) -> None:
    ips = [g.nic.ip for g in rack.gpus.values() if g.nic.ip]
    if len(set(ips)) != len(ips):
        raise RackError(src, "servers", "two GPU NICs have the same ip")
    free = rack.spec.network.subnet.num_addresses - 2 - len(ips)
    if free < len(rack.gpus) - len(ips):
        raise RackError(
            src, "network.subnet", f"{rack.spec.network.subnet} has too few addresses for {len(rack.gpus)} GPUs"
        )


def _check_engines(spec: RackSpec, src: str) -> None:
    urls: dict[str, str] = {}
    for i, s in enumerate(spec.servers):
        if s.docker.startswith("tcp://") and spec.engines.tls is None:
            raise RackError(
                src,
                f"servers[{i}].docker",
                f"{s.docker}: a tcp engine needs engines.tls (a plain TCP engine is root for anyone who reaches it)",
            )
        if s.docker != "local" and s.docker in urls:
            raise RackError(src, f"servers[{i}].docker", f"{s.docker} is also the engine of server {urls[s.docker]}")
        urls[s.docker] = s.name
    mgmt = spec.emulation.management
    if any(s.docker != "local" for s in spec.servers) and mgmt.overlaps(spec.network.subnet):
        raise RackError(src, "emulation.management", f"{mgmt} overlaps network.subnet {spec.network.subnet}")


def parse_rack(data: object, source: str = "<rack>") -> Rack:
    """Validate a decoded YAML document into a `Rack`, or raise `RackError`."""
    if data is None:
        raise RackError(
            source, "", "the file is empty; a rack file is a YAML mapping (see topologies/paper-testbed.yaml)"
        )
    if not isinstance(data, dict):
        raise RackError(source, "", f"a rack file is a YAML mapping, not a {type(data).__name__}")
    try:
        spec = RackSpec.model_validate(data)
    except ValidationError as e:
        # an unknown key first: it names the typo, which the missing field it stands for only follows from
        err = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")[0]
        more = f" (and {e.error_count() - 1} more problems)" if e.error_count() > 1 else ""
        raise RackError(source, _loc(err["loc"]) or "(top)", _pydantic_message(err) + more) from None
    _check_unique_names(spec, source)
    _check_cabling(spec, source)
    _check_uplinks(spec, source)
    _check_engines(spec, source)
    rack = Rack(spec, source)
    _check_circuits(spec, source, rack)
    _check_addresses(rack, source)
    return rack


def load_rack(path: Union[str, Path]) -> Rack:
    """Read and validate a rack file."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise RackError(source, "", f"cannot read: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise RackError(source, "", f"not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    return parse_rack(data, source)
