"""The controller's durable state in SQLite (WAL): one row per job and per event, one transaction per change.

A save writes only what changed (a job, an event, the circuit map), so it costs the same at the
first job and the ten-thousandth, and a process killed at any moment leaves the last committed
state, which loads. A legacy `state.json` next to the database is imported once, then renamed.
"""
from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

LOG = logging.getLogger("optirack.store")
SCHEMA = 1
TERMINAL = ("done", "failed", "stopped")
_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE,
                                 state TEXT NOT NULL, ended_at REAL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_ended ON jobs (state, ended_at);
CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, requested_at REAL NOT NULL, status TEXT NOT NULL,
                                   data TEXT NOT NULL);
"""


class StoreError(RuntimeError):
    """The state cannot be read; the message says which file and what to do."""


class Store:
    def __init__(self, path: Path, legacy: Path | None = None, clock=time.time):
        self.path, self.clock = Path(path), clock
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")  # a change answered is on disk, power cut included
            self.db.executescript(_TABLES)
        except sqlite3.DatabaseError as e:
            raise StoreError(f"{self.path}: {e}; move it away to start afresh") from None
        if legacy is not None and legacy.exists() and not self._meta():
            self._migrate(legacy)

    # --- reading -------------------------------------------------------------------------
    def _meta(self) -> dict:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}

    def rack(self) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = 'rack'").fetchone()
        return json.loads(row[0]) if row else None

    def load(self) -> dict:
        """{"rack", "circuits", "circuits_version", "jobs": [job state, in creation order]}
        (keys absent if never saved)."""
        state = self._meta()
        state.pop("schema", None)
        jobs = [json.loads(d) for (d,) in self.db.execute("SELECT data FROM jobs ORDER BY seq")]
        if jobs:
            state["jobs"] = jobs
        return state

    def events(self, limit: int, before: int | None = None) -> list[dict]:
        """The newest `limit` events with an id below `before`, oldest first."""
        rows = self.db.execute(
            "SELECT data FROM events WHERE id < ? ORDER BY id DESC LIMIT ?",
            (before if before is not None else 1 << 62, limit),
        ).fetchall()
        return [json.loads(d) for (d,) in reversed(rows)]

    def last_event_id(self) -> int:
        return self.db.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]

    def unfinished_events(self) -> list[dict]:
        return [json.loads(d) for (d,) in self.db.execute("SELECT data FROM events WHERE status = 'running'")]

    # --- writing: one transaction per call ------------------------------------------------------
    def save(self, meta: dict | None = None, jobs: Iterable[dict] = (), events: Iterable[dict] = ()) -> None:
        """Write these parts (meta keys, whole job states, whole event states) in one transaction."""
        with self._transaction() as db:
            for key, value in (meta or {}).items():
                db.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = "
                    "excluded.value",
                    (key, json.dumps(value)),
                )
            for job in jobs:
                db.execute(
                    "INSERT INTO jobs (id, state, ended_at, data) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
                    "SET state = excluded.state, ended_at = excluded.ended_at, data = excluded.data",
                    (job["id"], job["state"], job.get("ended_at"), json.dumps(job, separators=(",", ":"))),
                )
            for ev in events:
                db.execute(
                    "INSERT INTO events (id, requested_at, status, data) VALUES (?, ?, ?, ?) ON CONFLICT (id) "
                    "DO UPDATE SET status = excluded.status, data = excluded.data",
                    (ev["id"], ev["requested_at"], ev["status"], json.dumps(ev, separators=(",", ":"))),
                )

    def delete_jobs(self, ids: Iterable[str]) -> int:
        with self._transaction() as db:
            return sum(
                db.execute("DELETE FROM jobs WHERE id = ? AND state IN (?, ?, ?)", (i, *TERMINAL)).rowcount for i in ids
            )

    def delete_events(self, before_time: float) -> int:
        with self._transaction() as db:
            return db.execute(
                "DELETE FROM events WHERE requested_at < ? AND status != 'running'", (before_time,)
            ).rowcount

    def _transaction(self):
        return _Transaction(self.db)

    def close(self) -> None:
        self.db.close()

    # --- the JSON file of earlier versions ---------------------------------------------------
    def _migrate(self, legacy: Path) -> None:
        try:
            data = json.loads(legacy.read_text())
        except ValueError as e:
            raise StoreError(f"{legacy}: not valid JSON ({e}); move it away to start afresh") from None
        meta = {k: data[k] for k in ("rack", "circuits", "circuits_version") if k in data}
        self.save(meta={**meta, "schema": SCHEMA}, jobs=data.get("jobs", []))
        done = legacy.with_name(f"{legacy.name}.migrated-{int(self.clock())}")
        legacy.rename(done)
        LOG.warning(
            "imported %d jobs and the circuits from %s into %s; the old file is now %s",
            len(data.get("jobs", [])),
            legacy,
            self.path,
            done,
        )


class _Transaction:
    """BEGIN IMMEDIATE … COMMIT, or ROLLBACK if the block raised."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, *_) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")
