"""A worker that keeps its process when a peer is lost: ranks on loopback, real torch.distributed (gloo). One rank
stops answering (SIGSTOP: a server gone silent, no reset), the two others are handed a regroup command in their
control directories and form a new ring with a new process in the lost rank's place, from the newest checkpoint; then
the silent rank dies, under the old ring's threads that are still blocked on it, and the survivors go on."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

from emulation.harness import free_port


class Rank:
    def __init__(self, tmp, rank: int, argv: list[str]):
        self.control = tmp / f"control-{rank}"
        self.lines: list[dict] = []
        with open(tmp / f"stderr-{rank}-{id(self)}", "w") as err:  # a file: never a full pipe
            self.proc = subprocess.Popen([sys.executable, "-m", "containers.worker", "--control-dir",
                                          str(self.control), *argv], stdout=subprocess.PIPE, stderr=err, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def wait(self, timeout: float) -> int:
        """The process's exit status once it has ended and every line it wrote has been read (the reader reaches the
        pipe's end after the process: its last lines are not read yet when wait() returns)."""
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        assert not self.reader.is_alive(), "the rank's output never reached its end"
        return rc

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))

    def saved(self) -> int:
        return max((r["iteration"] for r in self.lines if r["event"] == "checkpoint"), default=0)

    def tell(self, attempt: int, argv: list[str]) -> None:
        tmp = self.control / f".regroup-{attempt}"
        tmp.write_text(json.dumps({"argv": argv}))
        tmp.rename(self.control / f"regroup-{attempt}.json")


def _wait(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ring_argv(tmp, ports, rank, master_port, attempt, extra, iterations, compute) -> list[str]:
    """A rank of a ring of three on loopback, checkpointing every iteration to the next rank's server; from attempt
    1 the new rank 2 (a spare) has a checkpoint port of its own (ports[3])."""
    mine, peer = ports[3 if attempt and rank == 2 else rank], ports[3 if attempt and rank == 1 else (rank + 1) % 3]
    return ["--rank", str(rank), "--world-size", "3", "--master", "127.0.0.1", "--master-port", str(master_port),
            "--ifname", "lo", "--iterations", str(iterations), "--compute-seconds", str(compute),
            "--rate-scale", "0.0005", "--checkpoint-dir", str(tmp / f"ckpt-{rank}"), "--checkpoint-every", "1",
            "--checkpoint-port", str(mine), "--checkpoint-peer", f"127.0.0.1:{peer}",
            "--attempt", str(attempt), "--timeout", "20", *extra]


def test_survivors_keep_their_process_and_regroup_with_a_new_rank(tmp_path):
    ports = [free_port() for _ in range(4)]  # checkpoint servers: on loopback the new rank 2 needs a port of its own
    first, second = free_port(), free_port()

    def argv(rank, master_port, attempt=0, extra=()):
        return ring_argv(tmp_path, ports, rank, master_port, attempt, extra, iterations=60, compute=0.02)

    ranks = [Rank(tmp_path, r, argv(r, first)) for r in range(3)]
    spare = None
    try:
        _wait(lambda: all(r.saved() >= 5 for r in ranks), 60, "five checkpoints on every rank")
        os.kill(ranks[2].proc.pid, signal.SIGSTOP)  # silent: the survivors' collectives hang, nothing resets
        time.sleep(0.3)
        k = min(r.saved() for r in ranks[:2])  # the newest iteration both survivors hold
        for r in (0, 1):
            ranks[r].tell(1, argv(r, second, 1, ["--resume-from", str(k), "--restore-from", "local"]))
        spare = Rank(tmp_path, 2, argv(2, second, 1, ["--resume-from", str(k), "--restore-from",
                                                       f"127.0.0.1:{ports[0]}", "--restore-writer", "rank-0"]))
        _wait(lambda: all(any(x["event"] == "iteration" and x["attempt"] == 1 for x in r.lines)
                          for r in (ranks[0], ranks[1], spare)), 60, "the new ring iterating")
        ranks[2].proc.kill()  # the silent peer dies now: its sockets reset under the old ring's threads, still blocked
        ranks[2].proc.wait()  # in the group the survivors left
        for r in (ranks[0], ranks[1], spare):
            assert r.wait(90) == 0, [x.lines[-3:] for x in (ranks[0], ranks[1], spare)]
    finally:
        for p in [r.proc for r in ranks] + ([spare.proc] if spare else []):
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in (ranks[0], ranks[1], spare):
        assert r.lines[-1]["event"] == "done" and r.lines[-1]["attempt"] == 1
        its = [x["iteration"] for x in r.lines if x["event"] == "iteration" and x["attempt"] == 1]
        assert its == list(range(k, 60)), its
    for r in ranks[:2]:  # the same process, its own state from memory, the new ring
        (regroup,) = [x for x in r.lines if x["event"] == "regroup"]
        assert regroup["pid"] == r.proc.pid and regroup["resume_from"] == k
        (restored,) = [x for x in r.lines if x["event"] == "restored"]
        assert restored["from"] == "memory" and restored["iteration"] == k
    (restored,) = [x for x in spare.lines if x["event"] == "restored"]
    assert restored["from"] == f"127.0.0.1:{ports[0]}"


def test_a_survivor_still_computing_when_told_never_joins_the_new_ring_with_its_old_thread(tmp_path):
    """The server-kill case of bench_failover: the peer goes silent while the survivors compute (no collective is
    blocked yet), the regroup comes at once and a warm spare makes the new ring form before the survivors' old
    threads finish computing. An old thread must not then send on the new ring (it did: a survivor exited 139, or
    a sum came out wrong)."""
    ports = [free_port() for _ in range(4)]
    first, second = free_port(), free_port()

    def argv(rank, master_port, attempt=0, extra=()):
        return ring_argv(tmp_path, ports, rank, master_port, attempt, extra, iterations=14, compute=0.6)

    ranks = [Rank(tmp_path, r, argv(r, first)) for r in range(3)]
    spare = Rank(tmp_path, 9, ["--warm", "--rank", "0", "--world-size", "1", "--master", "127.0.0.1"])
    try:
        _wait(lambda: all(r.saved() >= 3 for r in ranks) and any(x["event"] == "warm" for x in spare.lines), 60,
              "three checkpoints on every rank and the warm spare")
        n = max(x["iteration"] for x in ranks[0].lines if x["event"] == "iteration")
        _wait(lambda: any(x["event"] == "iteration" and x["iteration"] > n for x in ranks[0].lines), 10,
              "the next iteration")  # the ranks now compute for 0.6 s before their next collective
        os.kill(ranks[2].proc.pid, signal.SIGSTOP)
        k = min(r.saved() for r in ranks[:2])
        spare.tell(1, argv(2, second, 1, ["--resume-from", str(k), "--restore-from", f"127.0.0.1:{ports[0]}",
                                          "--restore-writer", "rank-0"]))
        for r in (0, 1):
            ranks[r].tell(1, argv(r, second, 1, ["--resume-from", str(k), "--restore-from", "local"]))
        for r in (ranks[0], ranks[1], spare):
            assert r.wait(90) == 0, [x.lines[-3:] for x in (ranks[0], ranks[1], spare)]
    finally:
        for p in [r.proc for r in ranks] + [spare.proc]:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r in (ranks[0], ranks[1], spare):
        assert r.lines[-1]["event"] == "done" and r.lines[-1]["attempt"] == 1
        its = [x["iteration"] for x in r.lines if x["event"] == "iteration" and x["attempt"] == 1]
        assert its == list(range(k, 14)), its
