"""topology.conf kept to the live circuits: after every circuit change (a job's regroup, a fail-over's swap, a
defragmentation, a change through REST), the fabric's tree is written beside slurm.conf and slurmctld reloads it.

The controller's Slurm app (controller/apps/slurm_api.py) calls `refresh` from one thread whenever the circuits'
version or slurm.conf changed, so at most one `scontrol reconfigure` is in flight: changes made while one runs are
folded into the next. None runs when the tree is the same as the file's (most circuit changes move GPUs, not a
node's majority switch). Nothing is kept unless slurm.conf exists and names `TopologyPlugin=topology/tree`.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from controller.core.circuits import CircuitMap
from controller.core.rack import Rack
from controller.slurm.conf import topology_conf
from controller.slurm.scheduler import Runner, SchedulerError, command_runner

HISTORY = 200  # reconfigurations remembered (GET /api/v1/slurm/topology)
RECONFIGURE_TIMEOUT = 60.0


def tree_plugin(slurm_conf: Path) -> bool:
    """Whether this slurm.conf has Slurm's tree topology plugin (False if it does not exist)."""
    try:
        text = slurm_conf.read_text()
    except OSError:
        return False
    return re.search(r"^\s*TopologyPlugin\s*=\s*topology/tree\s*$", text, re.M | re.I) is not None


class TopologyKeeper:
    def __init__(self, rack: Rack, slurm_conf: str | Path, circuits: Callable[[], CircuitMap],
                 run: Runner | None = None, clock: Callable[[], float] = time.time):
        self.rack, self.conf, self.circuits, self.clock = rack, Path(slurm_conf), circuits, clock
        self.path = self.conf.parent / "topology.conf"
        self.run = run or command_runner(self.conf)
        self.counts = {"refreshes": 0, "unchanged": 0, "reconfigures": 0, "failed": 0}
        self.history: deque[dict] = deque(maxlen=HISTORY)  # each reconfigure: started, seconds, ok, error
        self.in_flight = 0  # reconfigures running now (never above 1: one caller, synchronous)
        self.most_in_flight = 0
        self.stale = False  # the file's tree written, its reload refused or unanswered: the next refresh reloads

    def key(self) -> float | None:
        """What, besides the circuits' version, makes a refresh due: slurm.conf's modification time (a Slurm
        (re)started writes its files anew), None while there is none."""
        try:
            return self.conf.stat().st_mtime
        except OSError:
            return None

    def refresh(self) -> str:
        """Write the tree of the live circuits if it differs from the file's, then have slurmctld reload it.
        Returns what was done: "off" (no slurm.conf with the tree plugin), "unchanged", "reconfigured", or
        "failed" (written, the reload refused or unanswered: the history says why; the next refresh reloads again,
        even when the tree did not change since, as slurmctld may still hold the one before)."""
        if not tree_plugin(self.conf):
            return "off"
        self.counts["refreshes"] += 1
        text = topology_conf(self.rack, self.circuits())
        try:
            if self.path.read_text() == text and not self.stale:
                self.counts["unchanged"] += 1
                return "unchanged"
        except OSError:
            pass
        tmp = self.path.with_name(self.path.name + ".optirack-tmp")
        tmp.write_text(text)
        tmp.replace(self.path)  # slurmctld never reads half a file
        started = self.clock()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        error = ""
        try:
            proc = self.run(["scontrol", "reconfigure"], RECONFIGURE_TIMEOUT)
            if proc.returncode != 0:
                error = (proc.stderr or proc.stdout or f"exit {proc.returncode}").strip()
        except SchedulerError as e:
            error = str(e)
        finally:
            self.in_flight -= 1
        self.history.append({"started": started, "seconds": self.clock() - started, "ok": not error,
                             "error": error, "tree": [x for x in text.splitlines() if not x.startswith("#")]})
        self.counts["reconfigures" if not error else "failed"] += 1
        self.stale = bool(error)
        return "failed" if error else "reconfigured"

    def status(self) -> dict:
        return {"slurm_conf": str(self.conf), "topology": str(self.path), "kept": tree_plugin(self.conf),
                **self.counts, "in_flight": self.in_flight, "most_in_flight": self.most_in_flight,
                "stale": self.stale, "history": list(self.history)}
