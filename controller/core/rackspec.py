"""The rack file's schema: what each field of a rack file is and which values it takes (pydantic models), with the
error that names the file and the field. controller/core/rack.py checks the references between devices and builds
the rack from it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Annotated, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, model_validator

from controller.drivers import registry as ocs_drivers  # the OCS drivers by name: a leaf (it imports no project module)

# Emulated interfaces are named <device>-p<port> and Linux allows 15 characters.
NAME_PATTERN = r"^[a-z][a-z0-9]{0,8}$"
MAX_PORTS = 9999


class RackError(ValueError):
    """A rack file that cannot be used; `str()` is the message for the user."""

    def __init__(self, source: str, field: str, problem: str):
        self.source, self.field, self.problem = source, field, problem
        super().__init__(f"{source}: {field}: {problem}" if field else f"{source}: {problem}")


@dataclass(frozen=True, order=True)
class PortRef:
    """A port of a named device: ``ocs1:7`` in the rack file."""

    device: str
    port: int

    def __str__(self) -> str:
        return f"{self.device}:{self.port}"


def _port_ref(value: object) -> PortRef:
    if isinstance(value, PortRef):
        return value
    if not isinstance(value, str) or value.count(":") != 1:
        raise ValueError("expected 'device:port', e.g. 'ocs1:7'")
    device, port = value.split(":")
    if not port.isdigit() or int(port) < 1:
        raise ValueError(f"port in {value!r} must be a positive integer")
    return PortRef(device, int(port))


def _dpid(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer or a hex string")
    if isinstance(value, str):
        text = value.replace(":", "").lower()
        text = text[2:] if text.startswith("0x") else text
        try:
            value = int(text, 16)
        except ValueError:
            raise ValueError(f"{value!r} is not a datapath id (hex, e.g. 0x100)") from None
    if not isinstance(value, int) or not 0 < value < 2**64:
        raise ValueError("datapath id must be between 1 and 2**64-1")
    return value


Port = Annotated[PortRef, BeforeValidator(_port_ref), PlainSerializer(str, when_used="json")]
Dpid = Annotated[int, BeforeValidator(_dpid)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Rate = Annotated[float, Field(gt=0, le=1_600)]  # Gbit/s
PortNumber = Annotated[int, Field(ge=1, le=MAX_PORTS)]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class Nic(_Spec):
    rate_gbps: Rate
    ocs_port: Port
    ip: Optional[ipaddress.IPv4Address] = None  # default: taken from network.subnet in GPU order
    # The NIC's interface name on its server (a port or an SR-IOV VF); default: the GPU's name.
    interface: Optional[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,15}$")]] = None
    mac: Optional[Annotated[str, Field(pattern=r"^([0-9a-f]{2}:){5}[0-9a-f]{2}$")]] = None


class Gpu(_Spec):
    name: Name
    model: str
    index: Annotated[int, Field(ge=0)] = 0  # device index on its server (nvidia-smi numbering)
    nic: Nic


def _engine_url(value: object) -> str:
    """A server's Docker Engine: "local" (this host's), tcp://HOST:PORT (mutual TLS) or ssh://USER@HOST[:PORT]."""
    if not isinstance(value, str):
        raise ValueError("expected 'local', 'tcp://HOST:PORT' or 'ssh://USER@HOST'")
    if value == "local":
        return value
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in ("tcp", "ssh") or not rest or "/" in rest:
        raise ValueError(f"{value!r}: expected 'local', 'tcp://HOST:PORT' or 'ssh://USER@HOST[:PORT]'")
    if scheme == "ssh" and ("@" not in rest or not rest.split("@", 1)[0]):
        raise ValueError(f"{value!r}: an ssh engine names its user, e.g. ssh://optirack@{rest.split('@')[-1]}")
    host, colon, port = rest.split("@")[-1].rpartition(":")
    if scheme == "tcp" and not colon:
        raise ValueError(f"{value!r}: a tcp engine names its port, e.g. tcp://{rest}:2376")
    if colon and (not port.isdigit() or not 0 < int(port) < 65536 or not host):
        raise ValueError(f"{value!r}: {port!r} is not a port number")
    return value


EngineUrl = Annotated[str, BeforeValidator(_engine_url)]
FilePath = Annotated[str, Field(min_length=1)]


class Tls(_Spec):
    """Mutual TLS to tcp:// engines: the CA that signed the engines' certificates, and our client pair."""

    ca: FilePath
    cert: FilePath
    key: FilePath


class Engines(_Spec):
    # Certificates for every tcp:// engine (the emulated rack's are made by rack-up).
    tls: Optional[Tls] = None
    # Where engines pull the worker and NIC helper images (HOST:PORT, TLS); none: images are local.
    registry: Optional[Annotated[str, Field(pattern=r"^[A-Za-z0-9.-]+:[0-9]{1,5}$")]] = None
    # The NIC helper: the CNI host-device plugin in a short-lived container on each server's engine.
    helper_image: Annotated[str, Field(min_length=1)] = "optirack-cni:1"


class Server(_Spec):
    name: Name
    docker: EngineUrl = "local"  # Docker Engine: "local" or a URL (tcp://host:2376, ssh://user@host)
    gpus: Annotated[list[Gpu], Field(min_length=1)]


class Ocs(_Spec):
    name: Name
    ports: Annotated[int, Field(ge=2, le=MAX_PORTS)]
    dpid: Dpid
    switching_time_ms: Annotated[float, Field(ge=0, le=60_000)] = 25.0
    reconfiguration_time_ms: Optional[Annotated[float, Field(ge=0, le=600_000)]] = None
    driver: str = ocs_drivers.DEFAULT  # a name in controller/drivers/registry.py
    address: Optional[str] = None  # where the device is, in the form its driver declares

    @model_validator(mode="after")
    def _checked_by_its_driver(self):
        ocs_drivers.check(self)
        return self

    @property
    def bulk_time_ms(self) -> float:
        return self.switching_time_ms if self.reconfiguration_time_ms is None else self.reconfiguration_time_ms


class Downlink(_Spec):
    port: PortNumber
    ocs_port: Port
    rate_gbps: Rate


class Uplink(_Spec):
    port: PortNumber
    peer: Port
    rate_gbps: Rate


class InNetworkAggregator(_Spec):
    """A switch's in-network aggregator (controller/core/aggregators.py): on a port of the switch, at an address of
    network.subnet, taking a given number of jobs and bytes of slots at once."""

    port: PortNumber
    ip: ipaddress.IPv4Address
    udp_port: Annotated[int, Field(ge=1, le=65535)] = 9999
    jobs: Annotated[int, Field(ge=1, le=1024)] = 4
    capacity_bytes: Annotated[int, Field(ge=4)] = 16 << 20


class Switch(_Spec):
    name: Name
    dpid: Dpid
    role: Literal["aggregator", "core"] = "aggregator"
    downlinks: list[Downlink] = []
    uplinks: list[Uplink] = []
    aggregator: Optional[InNetworkAggregator] = None

    @model_validator(mode="after")
    def _aggregator_on_a_free_port(self):
        links = {d.port for d in self.downlinks} | {u.port for u in self.uplinks}
        if self.aggregator is not None and self.aggregator.port in links:
            raise ValueError(f"aggregator.port {self.aggregator.port} is also a downlink or uplink of {self.name}")
        return self


class Emulation(_Spec):
    rate_scale: Annotated[float, Field(gt=0, le=1)] = 0.0005
    # Emulated time runs this many times slower than the rack's: compute phases and gradient
    # sizes are both multiplied by it, so every ratio is kept while fixed software latencies of
    # the emulation (tens of ms per all-reduce on 2 cores) weigh less.
    time_dilation: Annotated[float, Field(ge=1, le=100)] = 1.0
    # MTU of every emulated NIC, uplink and OVS port. Jumbo frames cut the userspace datapath's
    # work per emulated bit about sixfold (each frame crosses userspace on its own; measured when the
    # datapath was chosen, docs/emulated-rack.md "Fidelity of the emulated fabric" has today's figures).
    mtu: Annotated[int, Field(ge=1280, le=9000)] = 9000
    # The emulated servers' management network (their engines' addresses, and the registry on the
    # bridge's last address). Outside the private ranges labs use.
    management: ipaddress.IPv4Network = ipaddress.IPv4Network("198.19.0.0/24")
    # lossless (default): like the paper's RoCE fabric with PFC, no queue drops a packet: each TCP
    # flow's bytes in flight are bounded (a route's `cwnd lock`) and every queue holds what all the
    # flows that can meet there may send. droptail: shallow queues that drop what overflows
    # (emulation/shaping.py), kept to compare the two.
    fabric: Literal["lossless", "droptail"] = "lossless"

    def mbps(self, rate_gbps: float) -> float:
        """The emulated rate in Mbit/s of a physical rate in Gbit/s."""
        return rate_gbps * 1000.0 * self.rate_scale


class Network(_Spec):
    subnet: ipaddress.IPv4Network = ipaddress.IPv4Network("198.18.0.0/24")


class RackSpec(_Spec):
    name: Name
    description: str = ""
    network: Network = Network()
    engines: Engines = Engines()
    emulation: Emulation = Emulation()
    servers: Annotated[list[Server], Field(min_length=1)]
    ocs: Annotated[list[Ocs], Field(min_length=1)]
    switches: Annotated[list[Switch], Field(min_length=1)]
    circuits: list[tuple[Port, Port]] = []
