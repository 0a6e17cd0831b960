"""The worker's `--collective aggregate`: its ring's gradients summed at the in-network aggregator instead of around
the ring (the client: containers/aggclient.py). The ring stays for everything else (rendezvous, barriers, the
end-of-run checks), and for the sums too when the aggregator refuses the job: every rank then runs as a ring."""
from __future__ import annotations

import fcntl
import socket
import struct
import time
import zlib

from containers import aggproto
from containers.aggclient import AggClient, Refused, round_trips
from containers.session import emit

JOIN_S = 5.0  # seconds a rank tries to join the aggregator before its job runs as a ring


def job_key(args) -> int:
    """The job's key at the aggregator: --aggregation-job, else one every rank of this attempt derives alike."""
    if args.aggregation_job is not None:
        return args.aggregation_job
    return zlib.crc32(f"{args.master}:{args.master_port}:{args.attempt}".encode())


def mtu_of(ifname: str) -> int:
    """The MTU of a network interface of this namespace (SIOCGIFMTU)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        packed = fcntl.ioctl(s.fileno(), 0x8921, struct.pack("16si", ifname.encode()[:15], 0))
    return struct.unpack("16si", packed)[1]


def pool_shape(args) -> tuple[int, int]:
    """(slots, chunk) of the job's pool: the flags where given, else a chunk that fills one frame of the NIC's MTU
    (aggproto.shape_for_mtu; the default chunk without --ifname) and slots holding about aggproto.WINDOW bytes."""
    if args.aggregation_chunk is not None:
        chunk = args.aggregation_chunk
    else:
        chunk = aggproto.shape_for_mtu(mtu_of(args.ifname))[1] if args.ifname else aggproto.DEFAULT_CHUNK
    slots = args.aggregation_slots or max(2, aggproto.WINDOW // (chunk * aggproto.ITEM))
    return slots, chunk


class Aggregation:
    """One ring's way to the aggregator: `client` is None where the job runs as a ring (`refused` says why)."""

    def __init__(self, args, client: AggClient | None, refused: str = ""):
        self.address, self.client, self.refused = args.aggregator, client, refused

    @classmethod
    def start(cls, args, ring, torch, device, bind: str) -> Aggregation | None:
        """Join the aggregator (collective: every rank of the ring calls it). None with --collective ring; an
        Aggregation without a client where any rank's join failed, so that every rank runs as a ring alike."""
        if args.collective != "aggregate":
            return None
        host, port = aggproto.parse_address(args.aggregator)
        slots, chunk = pool_shape(args)
        client = AggClient((host, port), job_key(args), ring.rank, ring.size, slots=slots, chunk=chunk,
                           bind=(bind, 0), rto=args.aggregation_rto,
                           timeout=args.timeout, check=ring.check)
        refused = ""
        client.timeout = min(args.timeout, JOIN_S)
        try:
            client.join()
        except (Refused, TimeoutError) as e:
            refused = str(e)
        client.timeout = args.timeout
        ok = torch.tensor([0.0 if refused else 1.0], device=device)
        ring.all_reduce(ok, op=ring.dist.ReduceOp.MIN)
        if float(ok) == 1.0:
            return cls(args, client)
        if not refused:
            refused = "another rank's join was refused"
            client.timeout = 1.0
            client.leave()
        client.close()
        return cls(args, None, refused)

    def fields(self) -> dict:
        """What the start line says of the collective."""
        if self.client is None:
            return {"collective": "ring", "aggregator": self.address, "aggregation_refused": self.refused}
        return {"collective": "aggregate", "aggregator": self.address, "aggregation_job": self.client.job,
                "aggregation_pool_bytes": self.client.slots * self.client.chunk * aggproto.ITEM}

    def all_reduce(self, torch, tensor) -> None:
        """Sum `tensor` over the job's ranks in place, through the aggregator (a CPU float32 copy where it is not
        one already: on a GPU, or another dtype)."""
        assert self.client is not None
        if tensor.device.type == "cpu" and tensor.dtype == torch.float32 and tensor.is_contiguous():
            self.client.all_reduce(tensor.view(-1).numpy())
            return
        host = tensor.detach().reshape(-1).to("cpu", torch.float32).contiguous()
        self.client.all_reduce(host.numpy())
        tensor.copy_(host.view(tensor.shape).to(tensor.device, tensor.dtype))

    def close(self) -> None:
        """Leave the aggregator (its job's slots are freed once every rank left); a second of trying at most."""
        if self.client is None:
            return
        emit({"event": "aggregated", "rank": self.client.rank, **self.client.stats,
              "round_trip": round_trips(self.client.rtts), "t": time.time()})
        self.client.timeout = 1.0
        try:
            self.client.leave()
        except TimeoutError:
            pass  # the aggregator frees a silent job's slots by itself
        self.client.close()
