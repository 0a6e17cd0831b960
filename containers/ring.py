"""One ring's process groups and its collectives: ring all-reduce over torch.distributed's point-to-point sends
(gloo), one connection per direction, and the few collectives the worker needs, each on this ring's own groups.

A worker that regroups (containers/session.py) leaves its ring for a new one in the same process; a thread of the
old ring may still be computing. Every collective here names the ring's own group, never the process's default one,
and first asks whether the ring is still current: a thread of a ring that was left raises Abandoned instead of
sending on the new ring (it did, once in about 20 server kills: two threads' sends interleaved on one connection and
the survivor died of SIGSEGV)."""
from __future__ import annotations


class Abandoned(RuntimeError):
    """This ring was left for a newer one: a thread still running in it stops before its next collective."""


class Ring:
    """The ring this process joined with init_process_group: its world group, the group each rank sends on in
    ring_all_reduce (index: the sender's rank) and whether it is still the current one (`current`, a callable).
    Collective: every rank builds it, right after init_process_group."""

    def __init__(self, dist, current=None):
        self.dist = dist
        self.world = dist.group.WORLD
        self.size, self.rank, self.backend = dist.get_world_size(), dist.get_rank(), dist.get_backend()
        self.current = current if current is not None else (lambda: True)
        self.aggregation = None  # --collective aggregate: the way to the aggregator (containers/aggregate.py)
        self.send = [self.world] * self.size
        if self.size == 2 and self.backend == "gloo":
            # gloo opens one connection per pair of ranks; in a ring of three or more each pair carries one
            # direction, but a ring of two would send both directions over one connection, so every ACK rides on
            # a data segment and waits behind data wherever the flows queue (a switch port's queue prioritises
            # only bare ACKs): its round trip, and with a bounded window its rate, is not that of two one-way
            # flows. A second group gives rank 1 its own connection to send on.
            self.send[1] = dist.new_group([0, 1])

    def check(self) -> None:
        if not self.current():
            raise Abandoned(f"rank {self.rank}: this ring was left for a newer one")

    def barrier(self) -> None:
        self.check()
        self.dist.barrier(group=self.world)

    def all_reduce(self, tensor, op=None) -> None:
        self.check()
        if op is None:
            self.dist.all_reduce(tensor, group=self.world)
        else:
            self.dist.all_reduce(tensor, op=op, group=self.world)

    def ring_all_reduce(self, torch, tensor) -> None:
        """Sum `tensor` over all ranks in place: reduce-scatter then all-gather around the ring rank -> rank+1, one
        chunk of 1/n per step, each step's send overlapped with its receive, each rank sending on its own group.

        Used with gloo: its built-in all-reduce pipelines small segments and, on the emulated rack, reached about
        81 % of the ring bound where this reaches about 90 % (scripts/bench_allreduce.py)."""
        n, rank, dist = self.size, self.rank, self.dist
        if n == 1:
            return
        chunks = list(tensor.chunk(n))
        right, left = (rank + 1) % n, (rank - 1) % n
        out, into = self.send[rank], self.send[left]
        scratch = torch.empty_like(chunks[0])
        for step in range(n - 1):  # reduce-scatter: after it, rank r holds the sum of chunk r+1
            send, recv = chunks[(rank - step) % n], chunks[(rank - step - 1) % n]
            self.check()
            req = dist.isend(send, right, group=out)
            incoming = scratch[: recv.numel()]
            dist.recv(incoming, left, group=into)
            recv += incoming
            req.wait()
        for step in range(n - 1):  # all-gather the summed chunks
            send, recv = chunks[(rank - step + 1) % n], chunks[(rank - step) % n]
            self.check()
            req = dist.isend(send, right, group=out)
            dist.recv(recv, left, group=into)
            req.wait()
