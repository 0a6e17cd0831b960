"""optirack-aggregator: the in-network aggregator of an aggregator switch, one process on one UDP port.

It stands for the aggregation engine inside the switch (PANAMA's bump-in-the-wire accelerator): jobs' workers
stream chunks of their gradients into per-job pools of slots, it sums each slot once every rank of the job has
contributed and sends the sum back to all of them (the protocol: containers/aggproto.py). Its capacity is how many
jobs it holds at once and how many bytes of slots in all; a job that does not fit is refused with the reason.

  python -m containers.aggregator --listen 10.0.0.9:9999 --jobs 4 --capacity-bytes 4194304
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from containers import aggproto as P

Key = tuple[int, int]  # (op, chunk): a slot's chunk, increasing in every slot
DropHook = Callable[[str, bytes], bool]  # ("in" | "out", datagram) -> drop it (tests inject loss with it)
LogHook = Callable[[dict], None]  # one JSON-able record of what happened to a job's pool (main prints it)


class Pool:
    """One job's slots: a float64 accumulator and a float32 result per slot (summing in float64 makes a slot's sum
    the same whatever order the ranks' chunks come in), the chunk each slot is summing and the last one it summed."""

    def __init__(self, job: int, world: int, slots: int, chunk: int):
        self.job, self.world, self.slots, self.chunk = job, world, slots, chunk
        self.addrs: list[tuple[str, int] | None] = [None] * world
        self.left: set[int] = set()
        self.acc = np.zeros((slots, chunk), dtype=np.float64)
        self.result = np.zeros((slots, chunk), dtype="<f4")
        self.count = [0] * slots  # elements of the slot's current chunk
        self.seen = [0] * slots  # bit r: rank r's chunk is in the accumulator
        self.cur: list[Key | None] = [None] * slots
        self.done: list[Key | None] = [None] * slots
        self.full = (1 << world) - 1
        self.active = time.monotonic()

    @property
    def nbytes(self) -> int:
        return self.slots * self.chunk * P.ITEM

    def shape(self) -> tuple[int, int, int]:
        return self.world, self.slots, self.chunk


class Aggregator:
    """The aggregator on a bound UDP socket; serve() runs it until stop is set (a thread or the process's main)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, jobs: int = 4, capacity_bytes: int = 16 << 20,
                 idle_s: float = 60.0, drop: DropHook | None = None, log: LogHook | None = None):
        if jobs < 1 or capacity_bytes < P.ITEM:
            raise ValueError(f"an aggregator holds at least one job and one element, not {jobs} jobs, "
                             f"{capacity_bytes} bytes")
        self.max_jobs, self.capacity, self.idle_s, self.drop = jobs, capacity_bytes, idle_s, drop
        self.log: LogHook = log or (lambda record: None)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            self.sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        self.sock.bind((host, port))
        self.address: tuple[str, int] = self.sock.getsockname()
        self.pools: dict[int, Pool] = {}
        self.stats = dict.fromkeys(("datagrams", "summed", "results", "resent", "duplicate", "stale", "stray",
                                    "dropped", "refused", "ended"), 0)
        self.stop = threading.Event()

    # -- the loop ---------------------------------------------------------------------------------------------
    def serve(self) -> None:
        buf = bytearray(P.MAX_DATAGRAM)
        view = memoryview(buf)
        self.sock.settimeout(0.2)
        next_sweep = time.monotonic() + 1.0
        while not self.stop.is_set():
            try:
                n, addr = self.sock.recvfrom_into(buf)
            except TimeoutError:
                n = 0
            except OSError:
                if self.stop.is_set():
                    return
                raise
            if n:
                self.handle(view[:n], addr)
            now = time.monotonic()
            if now >= next_sweep:
                next_sweep = now + 1.0
                for job in [j for j, p in self.pools.items() if now - p.active > self.idle_s]:
                    self.log({"event": "idle", "job": job, "freed_bytes": self.pools.pop(job).nbytes})

    def close(self) -> None:
        self.stop.set()
        self.sock.close()

    def _send(self, parts: list, addr: tuple[str, int]) -> None:
        if self.drop is not None and self.drop("out", b"".join(bytes(p) for p in parts)):
            self.stats["dropped"] += 1
            return
        try:
            self.sock.sendmsg(parts, [], 0, addr)
        except OSError:
            pass  # a worker's address gone: its timer sends again or its job ends

    def _reply(self, kind: int, job: int, rank: int, addr: tuple[str, int], reason: str = "") -> None:
        self._send([P.pack(kind, job, rank), reason.encode()], addr)

    def handle(self, data, addr: tuple[str, int]) -> None:
        self.stats["datagrams"] += 1
        if self.drop is not None and self.drop("in", bytes(data)):
            self.stats["dropped"] += 1
            return
        head = P.unpack(data)
        if head is None:
            self.stats["stray"] += 1
            return
        kind, job, rank, world, slot, op, chunk, count = head
        if kind == P.DATA:
            self._data(job, rank, slot, (op, chunk), count, data, addr)
        elif kind == P.JOIN:
            self._join(job, rank, world, slot, chunk, addr)
        elif kind == P.LEAVE:
            self._leave(job, rank, addr)
        elif kind == P.END:
            self._end(job)
        else:
            self.stats["stray"] += 1

    # -- the messages -----------------------------------------------------------------------------------------
    def _join(self, job: int, rank: int, world: int, slots: int, chunk: int, addr: tuple[str, int]) -> None:
        try:
            P.check_shape(slots, chunk)
            if not 1 <= world <= 1024 or not 0 <= rank < world:
                raise ValueError(f"rank {rank} of world {world}: a world of 1 to 1024 ranks, a rank below it")
        except ValueError as e:
            return self._refuse(job, rank, addr, str(e))
        pool = self.pools.get(job)
        if pool is not None and pool.shape() != (world, slots, chunk):
            return self._refuse(job, rank, addr, f"job {job} is already here with world, slots, chunk "
                                f"{pool.shape()}, not {(world, slots, chunk)}")
        if pool is not None and pool.addrs[rank] not in (None, addr):
            del self.pools[job]  # rank joins again from another address: a new run of the job, start afresh
            pool = None
        if pool is None:
            used = sum(p.nbytes for p in self.pools.values())
            need = slots * chunk * P.ITEM
            if len(self.pools) >= self.max_jobs:
                return self._refuse(job, rank, addr, f"the aggregator holds {len(self.pools)} jobs, its most")
            if used + need > self.capacity:
                return self._refuse(job, rank, addr, f"{need} bytes of slots asked, {self.capacity - used} of "
                                    f"{self.capacity} free")
            pool = self.pools[job] = Pool(job, world, slots, chunk)
        pool.addrs[rank] = addr
        pool.left.discard(rank)
        pool.active = time.monotonic()
        self._reply(P.JOINED, job, rank, addr)

    def _refuse(self, job: int, rank: int, addr: tuple[str, int], reason: str) -> None:
        self.stats["refused"] += 1
        self._reply(P.REFUSED, job, rank, addr, reason)

    def _leave(self, job: int, rank: int, addr: tuple[str, int]) -> None:
        pool = self.pools.get(job)
        if pool is not None and rank < pool.world and pool.addrs[rank] == addr:
            pool.left.add(rank)
            if len(pool.left) == pool.world:
                del self.pools[job]
        self._reply(P.LEFT, job, rank, addr)  # also to a LEAVE sent again after the job was freed

    def _end(self, job: int) -> None:
        """The job is over (the controller says so): its pool is freed now, not once it has been idle."""
        pool = self.pools.pop(job, None)
        self.stats["ended"] += 1
        self.log({"event": "ended", "job": job, "freed_bytes": 0 if pool is None else pool.nbytes})

    def _data(self, job: int, rank: int, slot: int, key: Key, count: int, data, addr: tuple[str, int]) -> None:
        pool = self.pools.get(job)
        if pool is None or rank >= pool.world or pool.addrs[rank] != addr or slot >= pool.slots \
                or count > pool.chunk:
            self.stats["stray"] += 1  # not a rank of this job (or not from its address): never summed in
            return
        pool.active = time.monotonic()
        if key == pool.done[slot]:  # this rank lost the sum: send it again
            self.stats["resent"] += 1
            self._result(pool, slot, [addr])
            return
        cur, bit = pool.cur[slot], 1 << rank
        payload = np.frombuffer(data, dtype="<f4", count=count, offset=P.HEADER.size)
        if cur is None:
            if pool.done[slot] is not None and key < pool.done[slot]:  # type: ignore[operator]
                self.stats["stale"] += 1
                return
            pool.cur[slot], pool.seen[slot], pool.count[slot] = key, bit, count
            pool.acc[slot, :count] = payload
        elif key == cur and count == pool.count[slot]:
            if pool.seen[slot] & bit:
                self.stats["duplicate"] += 1
                return
            pool.seen[slot] |= bit
            pool.acc[slot, :count] += payload
        else:  # an older chunk sent again, or one that cannot come before this slot's sum (another run's)
            self.stats["stale"] += 1
            return
        if pool.seen[slot] == pool.full:
            pool.result[slot, :count] = pool.acc[slot, :count]
            pool.done[slot], pool.cur[slot] = key, None
            self.stats["summed"] += 1
            self._result(pool, slot, pool.addrs)

    def _result(self, pool: Pool, slot: int, to) -> None:
        op, chunk = pool.done[slot]  # type: ignore[misc]
        count = pool.count[slot]
        parts = [P.pack(P.RESULT, pool.job, 0, pool.world, slot, op, chunk, count),
                 pool.result[slot, :count].view(np.uint8)]
        for addr in to:
            if addr is not None:
                self.stats["results"] += 1
                self._send(parts, addr)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="optirack-aggregator", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", default="0.0.0.0:9999",
                   help="HOST:PORT to receive on (port 0: any free one; default %(default)s)")
    p.add_argument("--jobs", type=int, default=4, help="jobs held at once (default %(default)s)")
    p.add_argument("--capacity-bytes", type=int, default=16 << 20,
                   help="bytes of slots for all jobs together (default %(default)s)")
    p.add_argument("--idle", type=float, default=60.0, help="free a job silent this many seconds (default 60)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        host, port = P.parse_address(args.listen, 9999, any_port=True)
        agg = Aggregator(host, port, jobs=args.jobs, capacity_bytes=args.capacity_bytes, idle_s=args.idle,
                         log=lambda record: print(json.dumps(record), flush=True))
    except (ValueError, OSError) as e:
        print(f"optirack-aggregator: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: agg.stop.set())
    print(json.dumps({"event": "listening", "address": list(agg.address), "jobs": agg.max_jobs,
                      "capacity_bytes": agg.capacity}), flush=True)
    try:
        agg.serve()
    except KeyboardInterrupt:
        pass
    print(json.dumps({"event": "stopped", **agg.stats}), flush=True)
    agg.sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
