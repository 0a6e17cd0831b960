"""The worker's process-wide state: the ring it is in (its attempt, and a generation a regroup moves on), its JSON
lines, its checkpoints (the saver, the states kept in memory, the one to go on from) and the controller's commands
(containers/worker.py runs the rings)."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

_EMIT = threading.Lock()  # the checkpoint thread prints too: one whole line at a time
# The ring this worker is in: its attempt (every line says it) and a generation that a regroup moves on; a thread of
# a ring the worker has left (blocked on a dead peer, or failing later) prints nothing more.
SESSION = {"attempt": 0, "gen": 0}
_THREAD = threading.local()


def emit(record: dict) -> None:
    gen = getattr(_THREAD, "gen", None)
    with _EMIT:
        if gen is not None and gen != SESSION["gen"]:
            return
        record.setdefault("attempt", SESSION["attempt"])
        print(json.dumps(record, separators=(",", ":")), flush=True)


class Checkpoints:
    """This rank's checkpoints (containers/checkpoint.py): the saver, and the state it restarts from."""

    def __init__(self, args, rank: int, memory: dict | None = None, server=None):
        from containers import checkpoint

        self.mod, self.args, self.rank = checkpoint, args, rank
        self.gen = SESSION["gen"]
        self.memory: dict[int, bytes] = memory if memory is not None else {}  # the newest states saved, in RAM
        self.server = server  # this worker's checkpoint server (serve): it serves this rank's states from memory
        self.root = Path(args.checkpoint_dir) if args.checkpoint_dir else None
        self.writer = os.environ.get("OPTIRACK_GPU_ID") or f"rank-{rank}"
        self.saver = None
        if self.root is not None and args.checkpoint_every > 0:
            self.saver = checkpoint.Saver(self.root, self.writer, args.checkpoint_every, args.checkpoint_peer,
                                          self._saved, args.checkpoint_port)

    def serve(self) -> None:
        if self.root is not None:
            self.root.mkdir(parents=True, exist_ok=True)
            self.server = self.mod.Server(self.root, port=self.args.checkpoint_port)

    def _saved(self, iteration: int, size: int, local_s: float, total_s: float) -> None:
        if self.gen != SESSION["gen"]:
            return  # a save of a ring this worker has left
        emit({"event": "checkpoint", "rank": self.rank, "iteration": iteration, "bytes": size,
              "writer": self.writer, "peer": self.args.checkpoint_peer, "local_s": local_s, "save_s": total_s,
              "t": time.time()})

    def save(self, iteration: int, data) -> None:
        """After `iteration` completed iterations, if one is due (`data`: a callable giving the bytes)."""
        if self.saver is not None and self.saver.due(iteration) and iteration < self.args.iterations:
            state = data()
            self.memory[iteration] = state
            for old in sorted(self.memory)[:-self.mod.KEEP]:
                del self.memory[old]
            if self.server is not None:
                self.server.hold(self.writer, iteration, state)
            self.saver.save(iteration, state)

    def finish(self) -> None:
        if self.saver is not None:
            self.saver.wait()

    def restore(self) -> bytes | None:
        """The state to go on from (None: start at iteration 0)."""
        a = self.args
        if not a.resume_from:
            return None
        t0, writer = time.time(), a.restore_writer or self.writer
        try:
            if a.resume_from in self.memory:  # a rank that kept its process: its own state, from memory
                data, a.restore_from, writer = self.memory[a.resume_from], "memory", self.writer
            elif a.restore_from in (None, "local"):
                if self.root is None:
                    raise FileNotFoundError("no --checkpoint-dir")
                data = self.mod.load(self.root, writer, a.resume_from)
            else:
                data = self.mod.get(a.restore_from, writer, a.resume_from, a.checkpoint_port)
        except FileNotFoundError as e:  # told to go on from a state nobody holds: say so, not a traceback
            held = sorted(self.memory)
            why = (f"rank {self.rank} was told to resume from iteration {a.resume_from} of {writer}, which is not held "
                   f"({a.restore_from or 'local'}: {e}; in memory: {held or 'nothing'})")
            emit({"event": "error", "rank": self.rank, "error": why})
            raise SystemExit(f"optirack-worker: {why}") from None
        emit({"event": "restored", "rank": self.rank, "iteration": a.resume_from, "writer": writer,
              "from": a.restore_from or "local", "bytes": len(data), "restore_s": time.time() - t0, "t": time.time()})
        return data


class Control:
    """Commands from the controller: files it hands the worker's control directory (the driver's put_archive).
    `regroup-<attempt>.json` holds {"argv": [...]}: leave the ring and join the attempt's new one with these
    arguments (rank, world size, master and its port, the checkpoint to go on from, the peer), keeping this process
    and its state."""

    def __init__(self, root: str):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def regroup(self, after: int) -> dict | None:
        """The newest regroup command for an attempt after `after` (None: none yet)."""
        found = []
        for p in self.root.glob("regroup-*.json"):
            n = p.stem.removeprefix("regroup-")
            if n.isdigit() and int(n) > after:
                found.append((int(n), p))
        if not found:
            return None
        try:
            return json.loads(max(found)[1].read_text())
        except ValueError:
            return None  # still being written: the next look reads it whole
