"""A worker's side of in-network aggregation: join a job's pool at the aggregator, then sum float32 arrays through
it in place, streaming chunks into the pool's slots (the protocol: containers/aggproto.py).

Each slot has one chunk in flight and a timer: a chunk whose sum has not come back when its timer runs out is sent
again (the timer doubles each time, up to 32 times the first), and the collective fails after `timeout` seconds
without its sums. A sum that comes back twice, or for a chunk no longer in flight, is ignored."""
from __future__ import annotations

import socket
import time
from collections.abc import Callable

import numpy as np

from containers import aggproto as P

DropHook = Callable[[str, bytes], bool]  # ("in" | "out", datagram) -> drop it (tests inject loss with it)


RTT_KEPT = 100_000  # round trips a client keeps (a run's first ones)
# a chunk's timer before any round trip is known (RFC 6298, 2.1: one second): the first collective's sums wait for
# every rank's first chunks across the rack (on the spread 4-GPU job 120-155 ms), longer than any `rto` floor given
FIRST_TIMER = 1.0


def round_trips(rtts: list[float]) -> dict:
    """A client's round trips (seconds) in milliseconds: how many, the 10th percentile, the median and the 90th."""
    if not rtts:
        return {"count": 0}
    xs = sorted(rtts)
    ms = {q: round(1000 * xs[min(len(xs) - 1, int(q * len(xs)))], 3) for q in (0.1, 0.5, 0.9)}
    return {"count": len(xs), "p10_ms": ms[0.1], "median_ms": ms[0.5], "p90_ms": ms[0.9]}


class Refused(RuntimeError):
    """The aggregator would not hold this job (full, or the job is there with another shape): the reason."""


class AggClient:
    """One rank's connection to an aggregator: `join()`, then `all_reduce(array)` as often as needed, `leave()`."""

    def __init__(self, aggregator: tuple[str, int], job: int, rank: int, world: int, *, slots: int = P.DEFAULT_SLOTS,
                 chunk: int = P.DEFAULT_CHUNK, bind: tuple[str, int] = ("0.0.0.0", 0), rto: float = 0.05,
                 timeout: float = 600.0, drop: DropHook | None = None, check: Callable[[], None] | None = None):
        P.check_shape(slots, chunk)
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in a world of {world}")
        if not 0 <= job < 1 << 32:
            raise ValueError(f"a job's key is an unsigned 32-bit number, not {job}")
        self.aggregator, self.job, self.rank, self.world = aggregator, job, rank, world
        self.slots, self.chunk, self.rto, self.timeout, self.drop = slots, chunk, rto, timeout, drop
        self.check = check  # called as the timers are looked at: it raises to abandon a collective (a left ring)
        self.op = 0
        self.stats = dict.fromkeys(("sent", "resent", "received", "ignored", "dropped"), 0)
        self.rtts: list[float] = []  # seconds from a chunk's send to its sum's arrival, chunks sent once (RTT_KEPT)
        self.srtt: float | None = None  # the smoothed round trip and its deviation (RFC 6298's estimator)
        self.rttvar = 0.0
        self.backoff = 1  # Karn: a timer that ran out doubles the next chunks' too, until one comes back sent once
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            self.sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        self.sock.bind(bind)
        self._buf = bytearray(P.MAX_DATAGRAM)

    def close(self) -> None:
        self.sock.close()

    def sample(self, rtt: float) -> None:
        """A chunk's round trip (seconds), of a chunk sent once: kept, into the smoothed estimate the timers use, and
        the timers' backoff ends."""
        self.backoff = 1
        if len(self.rtts) < RTT_KEPT:
            self.rtts.append(rtt)
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt

    def timer(self) -> float:
        """A chunk's retransmission timeout: the smoothed round trip and four deviations, never under `rto`: a pool
        whose sums come back slower than `rto` (across a loaded uplink) is not sent again before its time."""
        return max(self.rto, FIRST_TIMER) if self.srtt is None else max(self.rto, self.srtt + 4 * self.rttvar)

    def chunk_timer(self) -> float:
        """A new chunk's timer: `timer()` times the backoff. Only chunks sent once are sampled, so while sums come
        back later than the timers (a queue grown on the way), no sample lowers them; without the backoff kept,
        every new chunk got the short timer again, was sent again, and the duplicates (and the sums the aggregator
        sent again for them) kept the queue long: runs on the rack's spread job sent a NIC's gradient 2.3 times."""
        return self.timer() * self.backoff

    def timed_out(self, tries: int) -> None:
        """A chunk's timer ran out for the `tries`-th time: new chunks' timers back off as much (RFC 6298, 5.5)."""
        self.backoff = min(max(self.backoff, 1 << min(tries, 5)), 32)

    def _send(self, parts: list) -> None:
        if self.drop is not None and self.drop("out", b"".join(bytes(p) for p in parts)):
            self.stats["dropped"] += 1
            return
        try:
            self.sock.sendmsg(parts, [], 0, self.aggregator)
        except OSError:  # a full queue under the socket (ENOBUFS), the way gone for now: lost, its timer sends again
            self.stats["dropped"] += 1

    def _recv(self, wait: float):
        """The next datagram of ours (header, payload view) within `wait` seconds, else None."""
        self.sock.settimeout(max(wait, 1e-4))
        try:
            n = self.sock.recv_into(self._buf)
        except TimeoutError:
            return None
        data = memoryview(self._buf)[:n]
        if self.drop is not None and self.drop("in", bytes(data)):
            self.stats["dropped"] += 1
            return None
        head = P.unpack(data)
        if head is None or head[1] != self.job:
            self.stats["ignored"] += 1
            return None
        return head, data

    def _exchange(self, kind: int, answers: tuple[int, ...], **fields) -> tuple:
        """Send a control message until one of `answers` comes back (its header and payload)."""
        deadline, rto = time.monotonic() + self.timeout, self.rto
        while time.monotonic() < deadline:
            self._send([P.pack(kind, self.job, self.rank, self.world, **fields)])
            until = time.monotonic() + rto
            while (left := until - time.monotonic()) > 0:
                got = self._recv(left)
                if got is not None and got[0][0] in answers:
                    return got
            rto = min(rto * 2, 1.0)
        raise TimeoutError(f"no answer from the aggregator at {self.aggregator[0]}:{self.aggregator[1]} "
                           f"in {self.timeout:g} s")

    def join(self) -> None:
        head, data = self._exchange(P.JOIN, (P.JOINED, P.REFUSED), slot=self.slots, chunk=self.chunk)
        if head[0] == P.REFUSED:
            raise Refused(bytes(data[P.HEADER.size:]).decode(errors="replace"))

    def leave(self) -> None:
        self._exchange(P.LEAVE, (P.LEFT,))

    def all_reduce(self, array: np.ndarray) -> None:
        """Sum a 1-D contiguous float32 array over the job's ranks, in place (every rank gets the same sum)."""
        if array.dtype != np.float32 or array.ndim != 1 or not array.flags.c_contiguous:
            raise TypeError(f"aggregation sums a 1-D contiguous float32 array, not {array.dtype} of shape "
                            f"{array.shape}")
        op, self.op = self.op, self.op + 1
        size, C, S = array.size, self.chunk, self.slots
        nchunks = -(-size // C)
        raw = array.view(np.uint8)
        job, rank, world = self.job, self.rank, self.world
        flight = [-1] * S  # the chunk each slot has in flight (-1: none)
        due = [0.0] * S  # when its timer runs out
        tries = [0] * S
        sent_at = [0.0] * S  # when the slot's chunk was first sent

        def send(slot: int, k: int) -> None:
            count = min(C, size - k * C)
            self._send([P.pack(P.DATA, job, rank, world, slot, op, k, count),
                        raw[k * C * P.ITEM:(k * C + count) * P.ITEM]])

        now = time.monotonic()
        for k in range(min(S, nchunks)):
            flight[k], due[k], sent_at[k] = k, now + self.chunk_timer(), time.monotonic()
            send(k, k)
        self.stats["sent"] += min(S, nchunks)
        remaining, deadline, sweep = nchunks, now + self.timeout, now + self.rto / 2
        while remaining:
            got = self._recv(sweep - time.monotonic())
            if got is not None:
                (kind, _, _, _, slot, rop, k, count), data = got
                if kind != P.RESULT or rop != op or slot >= S or flight[slot] != k \
                        or count != min(C, size - k * C):
                    self.stats["ignored"] += 1  # a sum sent twice, or of an earlier collective
                else:
                    array[k * C:k * C + count] = np.frombuffer(data, dtype="<f4", count=count, offset=P.HEADER.size)
                    self.stats["received"] += 1
                    if tries[slot] == 0:  # a resent chunk's round trip is ambiguous (Karn)
                        self.sample(time.monotonic() - sent_at[slot])
                    remaining -= 1
                    nxt = k + S
                    if nxt < nchunks:
                        sent_at[slot] = time.monotonic()
                        flight[slot], due[slot], tries[slot] = nxt, sent_at[slot] + self.chunk_timer(), 0
                        send(slot, nxt)
                        self.stats["sent"] += 1
                    else:
                        flight[slot] = -1
            now = time.monotonic()
            if now >= sweep:
                sweep = now + self.rto / 2
                if self.check is not None:
                    self.check()
                if now > deadline:
                    raise TimeoutError(f"rank {rank}: {remaining} of {nchunks} chunks not summed by the aggregator "
                                       f"at {self.aggregator[0]}:{self.aggregator[1]} in {self.timeout:g} s")
                for slot in range(S):
                    if flight[slot] >= 0 and now >= due[slot]:
                        tries[slot] += 1
                        self.timed_out(tries[slot])
                        due[slot] = now + self.timer() * (1 << min(tries[slot], 5))
                        send(slot, flight[slot])
                        self.stats["resent"] += 1
