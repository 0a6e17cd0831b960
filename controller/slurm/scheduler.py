"""Slurm as the job service's scheduler port: what the controller tells the Slurm that schedules the rack, and asks it.

- `node_lost`: a server under a Slurm job is dead. Its node is set DOWN with the reason at once (`scontrol update
  NodeName=... State=DOWN Reason="optirack: ..."`), so that slurmctld ends the job's steps and requeues a batch job
  that asked for it (`--requeue`) now, not after its own `SlurmdTimeout`.
- `node_back`: the server answers again. Its node is resumed, only if it is still down for the reason we gave (a node
  an administrator took down, or one Slurm itself found unresponsive, is left to them).
- `ended`: of the Slurm jobs the controller holds, those whose run is over and how, as `squeue` and `sacct` say; a
  controller that restarts releases them with no hand step.

The job service calls these from its loop (controller/jobs/detect.py, restart.py). One thing the loop does not see is
left to the Slurm app at start (`resume_answering`): the nodes a controller before this one set down, whose servers
answer again, are resumed.

A server is the Slurm node of its own name (controller/slurm/conf.py writes slurm.conf so). Every command runs with
SLURM_CONF set to the slurm.conf given, as the user the controller runs as: marking nodes needs Slurm's operator
rights (root, SlurmUser, or an AdminLevel given with sacctmgr). Nothing here waits for Slurm longer than `timeout`.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from controller.core.rack import Rack
from controller.slurm.conf import node_name

OURS = "optirack:"  # the start of every node reason we give: how node_back knows a node is down because of us
REASON_MAX = 200  # characters of a reason kept (slurmctld keeps a node's reason in its state and shows it in sinfo)

# squeue's states (%T) of a job whose run still holds its nodes: the controller keeps its GPUs
HOLDING = {"CONFIGURING", "RUNNING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"}
# states of a job waiting to run again: the run the controller held is over (requeued, by Slurm or by hand)
AGAIN = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SPECIAL_EXIT", "RESV_DEL_HOLD"}
UNKNOWN = "UNKNOWN: slurmctld no longer knows the job and sacct has no record of it"

Runner = Callable[[list[str], float], subprocess.CompletedProcess]


class SchedulerError(RuntimeError):
    """Slurm could not be asked or refused (slurmctld down, no rights to mark nodes): the message says which command
    and what it printed. Nothing was changed by a call that raised it."""


def command_runner(slurm_conf: str | Path | None) -> Runner:
    """Runs a Slurm command with SLURM_CONF (None: Slurm's own default, or the controller's environment's)."""
    env = dict(os.environ)
    if slurm_conf:
        env["SLURM_CONF"] = str(slurm_conf)

    def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
        except FileNotFoundError as e:
            raise SchedulerError(f"{argv[0]} is not installed here ({e.strerror}): install Slurm's client") from None
        except subprocess.TimeoutExpired:
            raise SchedulerError(f"{' '.join(argv[:3])}: no answer from slurmctld within {timeout:g} s") from None

    return run


def _field(text: str, key: str) -> str:
    m = re.search(rf"(?:^|\s){key}=(\S*)", text)
    return m.group(1) if m else ""


class SlurmScheduler:
    """The job service's SchedulerPort for a Slurm (see the module's docstring)."""

    name = "slurm"

    def __init__(self, rack: Rack, run: Runner | None = None, slurm_conf: str | Path | None = None,
                 timeout: float = 10.0):
        self.rack, self.timeout = rack, timeout
        self.run = run or command_runner(slurm_conf)

    def _ok(self, argv: list[str]) -> str:
        proc = self.run(argv, self.timeout)
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout or "").strip() or f"exit {proc.returncode}"
            raise SchedulerError(f"{' '.join(argv)}: {said}")
        return proc.stdout

    def node_lost(self, job: str, server: str, why: str) -> None:
        node = node_name(self.rack, server)
        text = " ".join(f"{OURS} {why} (Slurm job {job})".split())[:REASON_MAX]
        self._ok(["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={text}"])

    def node_state(self, server: str) -> tuple[str, str]:
        """The node's state (`DOWN+NOT_RESPONDING`, `IDLE`, ...) and its reason ('' if none), as scontrol shows them."""
        shown = self._ok(["scontrol", "show", "node", node_name(self.rack, server)])
        reason = re.search(r"^\s*Reason=(.*?)(?:\s+\[[^\]]*\])?\s*$", shown, re.M)
        return _field(shown, "State"), reason.group(1) if reason else ""

    def node_back(self, server: str) -> None:
        state, reason = self.node_state(server)
        flags = set(state.split("+"))
        if reason.startswith(OURS) and flags & {"DOWN", "DRAIN", "DRAINED", "DRAINING"}:
            self._ok(["scontrol", "update", f"NodeName={node_name(self.rack, server)}", "State=RESUME"])

    def resume_answering(self, answers: Callable[[str], bool]) -> list[str]:
        """At start: every server whose engine answers (`answers(server)`) has its node resumed if it is down for us
        (node_back leaves every other node as it is). Returns the servers asked about."""
        asked = [s for s in self.rack.servers if answers(s)]
        for server in asked:
            self.node_back(server)
        return asked

    def ended(self, jobs: list[str]) -> dict[str, str]:
        """Of `jobs` (Slurm job ids), those whose run is over: id -> the state Slurm gives (squeue's while slurmctld
        still lists the job, else sacct's). A job waiting to run again (requeued) is over for the controller: its
        state is given with "(requeued)". One still COMPLETING is over once sacct has its end. Raises
        SchedulerError if squeue cannot be asked (nothing is known then)."""
        wanted = [str(j) for j in jobs]
        if not wanted:
            return {}
        listed: dict[str, str] = {}
        for line in self._ok(["squeue", "--noheader", "--all", "--states=all", "--format=%A|%T"]).splitlines():
            jid, _, state = line.strip().partition("|")
            listed[jid] = state.strip()
        out: dict[str, str] = {}
        ask: list[str] = []
        for jid in wanted:
            shown = listed.get(jid)
            if shown in HOLDING:
                continue
            if shown in AGAIN:
                out[jid] = f"{shown} (requeued)"
            elif shown is None or shown == "COMPLETING":
                ask.append(jid)
            else:
                out[jid] = shown
        accounted = self._accounted(ask) if ask else {}
        for jid in ask:
            state = accounted.get(jid, "")
            if state and state.split()[0] not in HOLDING | AGAIN | {"COMPLETING"}:
                out[jid] = state
            elif listed.get(jid) is None:  # slurmctld has forgotten it: over, however it ended
                out[jid] = f"{state} (slurmctld no longer lists it)" if state else UNKNOWN
        return out

    def _accounted(self, jobs: list[str]) -> dict[str, str]:
        """sacct's state of each job's newest run (none where accounting is off or holds nothing of it)."""
        proc = self.run(["sacct", "--noheader", "--parsable2", "--allocations", "--allusers", "--format=JobIDRaw,State",
                         "--jobs", ",".join(jobs)], self.timeout)
        if proc.returncode != 0:
            return {}
        found = {}
        for line in proc.stdout.splitlines():
            jid, _, state = line.partition("|")
            if jid:
                found[jid] = state.strip()
        return found


def configured(rack: Rack, slurm_conf: str | None) -> SlurmScheduler | None:
    """The scheduler port for the controller's `--optirack-slurm-conf` (None when it is 'none' or empty)."""
    if not slurm_conf or slurm_conf == "none":
        return None
    return SlurmScheduler(rack, slurm_conf=slurm_conf)
