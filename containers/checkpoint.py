"""Checkpoints of one rank: saved every K iterations on its own server and on a peer's on another server, so that no
single server's loss loses the last copy, and fetched back when the ranks restart from one.

Every worker serves the checkpoints held on its server (a TCP port on its NIC: the job's own fabric) from a
directory that outlives the worker (the driver mounts a volume of the job there): `<dir>/<writer>/iter-<k>.bin`,
the two newest per writer. A save writes the local copy, then sends it to the peer in the background (the next
iteration's compute overlaps it); once the peer has it, the rank prints a `checkpoint` line naming the iteration
and the peer, which is what the controller counts as saved. A restarted rank fetches iteration k of one writer's
copy, from its own disk (`local`) or from the holder's worker, which may itself be starting: it retries until then.

Protocol: one JSON header line, then `size` bytes of payload: {"op": "put", "writer", "iteration", "size"} is
answered "ok\\n"; {"op": "get", "writer", "iteration"} is answered with a header {"size": n} (or {"error": ...})
and the bytes.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

PORT = 29501
KEEP = 2  # checkpoints kept per writer


def _path(root: Path, writer: str, iteration: int) -> Path:
    return root / writer / f"iter-{iteration}.bin"


def store(root: Path, writer: str, iteration: int, data: bytes) -> None:
    """Write one checkpoint atomically and keep only the newest KEEP of that writer."""
    d = root / writer
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".iter-{iteration}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, _path(root, writer, iteration))
    held = sorted((int(p.stem.split("-")[1]) for p in d.glob("iter-*.bin")), reverse=True)
    for old in held[KEEP:]:
        _path(root, writer, old).unlink(missing_ok=True)


def load(root: Path, writer: str, iteration: int) -> bytes:
    return _path(root, writer, iteration).read_bytes()


def _read_exact(conn: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("the peer closed the connection mid-transfer")
        buf += chunk
    return bytes(buf)


def _read_line(conn: socket.socket) -> dict:
    buf = bytearray()
    while not buf.endswith(b"\n"):
        c = conn.recv(1)
        if not c:
            raise ConnectionError("the peer closed the connection")
        buf += c
        if len(buf) > 4096:
            raise ValueError("header too long")
    return json.loads(buf)


class Server:
    """Serves and stores checkpoints of any writer under `root`, one thread per connection."""

    def __init__(self, root: Path, host: str = "0.0.0.0", port: int = PORT):
        self.root = root
        self.memory: dict[str, dict[int, bytes]] = {}  # writer -> its newest KEEP states, served without the disk
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def hold(self, writer: str, iteration: int, data: bytes) -> None:
        """Keep a state in memory (the newest KEEP of each writer)."""
        with self.lock:
            held = self.memory.setdefault(writer, {})
            held[iteration] = data
            for old in sorted(held)[:-KEEP]:
                del held[old]

    def _held(self, writer: str, iteration: int) -> bytes | None:
        with self.lock:
            return self.memory.get(writer, {}).get(iteration)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                head = _read_line(conn)
                if head["op"] == "put":
                    data = _read_exact(conn, int(head["size"]))
                    self.hold(head["writer"], int(head["iteration"]), data)
                    conn.sendall(b"ok\n")  # held in memory; the disk copy, the fallback, follows
                    store(self.root, head["writer"], int(head["iteration"]), data)
                elif head["op"] == "get":
                    try:
                        data = self._held(head["writer"], int(head["iteration"]))
                        if data is None:
                            data = load(self.root, head["writer"], int(head["iteration"]))
                    except OSError:
                        conn.sendall(json.dumps({"error": "no such checkpoint"}).encode() + b"\n")
                        return
                    conn.sendall(json.dumps({"size": len(data)}).encode() + b"\n" + data)
            except (OSError, ValueError, KeyError):
                pass  # a peer that went away mid-request: it retries or is replaced


def _address(host: str, port: int) -> tuple[str, int]:
    """HOST or HOST:PORT (several workers on one host, e.g. on loopback, serve on ports of their own)."""
    name, _, p = host.partition(":")
    return name, int(p) if p else port


def put(host: str, writer: str, iteration: int, data: bytes, port: int = PORT, timeout: float = 60.0) -> None:
    with socket.create_connection(_address(host, port), timeout=timeout) as conn:
        head = {"op": "put", "writer": writer, "iteration": iteration, "size": len(data)}
        conn.sendall(json.dumps(head).encode() + b"\n" + data)
        if _read_exact(conn, 3) != b"ok\n":
            raise ConnectionError(f"the checkpoint peer {host} did not store iteration {iteration}")


def get(host: str, writer: str, iteration: int, port: int = PORT, timeout: float = 60.0) -> bytes:
    """Fetch a checkpoint, retrying until the holder's worker answers (it may be starting too) or `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(_address(host, port), timeout=10) as conn:
                conn.sendall(json.dumps({"op": "get", "writer": writer, "iteration": iteration}).encode() + b"\n")
                head = _read_line(conn)
                if "error" in head:
                    raise FileNotFoundError(f"{host} holds no checkpoint of {writer} at iteration {iteration}")
                return _read_exact(conn, int(head["size"]))
        except (ConnectionError, OSError) as e:
            if isinstance(e, FileNotFoundError) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Saver:
    """Saves a rank's state every `every` iterations, in the background: the local disk copy, then the peer's (held
    in its memory, then on its disk); one save at a time: a save waits for the previous one to reach its peer.
    `report` is called once both copies exist."""

    def __init__(self, root: Path, writer: str, every: int, peer: str | None, report, port: int = PORT):
        self.root, self.writer, self.every, self.peer, self.report, self.port = root, writer, every, peer, report, port
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def due(self, iteration: int) -> bool:
        """Whether the state after `iteration` completed iterations is saved."""
        return self.every > 0 and iteration > 0 and iteration % self.every == 0

    def save(self, iteration: int, data: bytes) -> None:
        t0 = time.time()
        self.wait()
        local_s = time.time() - t0  # the training loop held (the state itself is in memory already)

        def send() -> None:
            try:
                store(self.root, self.writer, iteration, data)
                if self.peer:
                    put(self.peer, self.writer, iteration, data, self.port)
                self.report(iteration, len(data), local_s, time.time() - t0)
            except BaseException as e:  # noqa: BLE001 (raised in the training thread by the next wait)
                self.error = e

        self.thread = threading.Thread(target=send, daemon=True)
        self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            raise RuntimeError(f"saving a checkpoint to {self.peer} failed: {self.error}")
