"""`optirack-slurm-hook prolog|epilog`: Slurm's PrologSlurmctld and EpilogSlurmctld.

slurmctld runs the prolog once a job has its nodes and before any of its tasks start (the job is
CONFIGURING meanwhile), and the epilog once it has ended for any reason (completed, failed,
scancel, time limit, node lost). The prolog reads which GPUs Slurm gave the job and asks the
controller to regroup them under one aggregator switch; the epilog tells the controller the job
ended, which releases its circuits. What happened is written into the job's comment, which
`scontrol show job` and `sacct --format Comment` show. Neither ever hangs a job: the controller
is given a few seconds, and when it cannot be reached the job runs as Slurm placed it (or, with
`--unreachable fail`, is requeued) and its comment says why. topology.conf is not theirs: the
controller keeps it to the live circuits after every change (controller/slurm/topology.py).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from urllib.parse import urlsplit

# Only what starts fast: slurmctld waits for the prolog before the job's first task, so its own start is part of every
# job's (no requests, no rack file: the controller names the GPUs behind Slurm's nodes and GRES indexes)
from controller.client import DEFAULT_URL, ApiError, find_token
from controller.slurm.allocation import AllocationError, read

TIMEOUT_S = 20.0  # the controller's regroup is a dark window of tens of ms; PrologEpilogTimeout is 60 s
HOLD_WORD = "optirack:hold"  # in a job's --comment: wait until it can be regrouped rather than run fragmented
FIXED_WORD = "optirack:fixed"  # in a job's --comment: keep its GPUs where they are (hold them, no circuit change)


class Controller:
    """The controller's REST API, as much as the hooks need: POST with the token, within `timeout`. Raises ApiError
    (status 0 when the controller cannot be reached or does not answer in time)."""

    def __init__(self, url: str | None, token: str | None, timeout: float = 20.0):
        self.url = (url or os.environ.get("OPTIRACK_URL") or DEFAULT_URL).rstrip("/")
        self.token, self.timeout = token, timeout

    def post(self, path: str, body: dict) -> dict:
        where = urlsplit(self.url)
        conn_cls = http.client.HTTPSConnection if where.scheme == "https" else http.client.HTTPConnection
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {self.token}"}
                                                          if self.token else {})}
        try:
            conn = conn_cls(where.hostname or "127.0.0.1", where.port, timeout=self.timeout)
            conn.request("POST", f"{where.path}/api/v1{path}", json.dumps(body), headers)
            resp = conn.getresponse()
            raw = resp.read()
            conn.close()
        except (OSError, http.client.HTTPException) as e:  # refused, unreachable, timed out, cut
            raise ApiError(0, f"cannot reach the controller at {self.url} ({e.__class__.__name__}: {e})") from None
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            data = {}
        if resp.status >= 400:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            raise ApiError(resp.status, err.get("message", raw.decode(errors="replace").strip()[:200]),
                           err.get("field"), data)
        return data


def scontrol(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30)


def set_comment(job: str, note: str, old: str = "") -> None:
    """The job's comment: our note first, then what the user had written (minus an older note of ours)."""
    kept = old.split(" | ", 1)[1] if old.startswith("optirack: ") and " | " in old else (
        "" if old.startswith("optirack: ") else old)
    text = note + (f" | {kept}" if kept else "")
    proc = scontrol("update", f"JobId={job}", f"Comment={text}")
    if proc.returncode != 0:
        print(f"optirack-slurm-hook: job {job}: cannot set its comment: {proc.stderr.strip()}", file=sys.stderr)


def prolog(args, client: Controller, job: str) -> int:
    proc = scontrol("show", "job", "-d", job)
    if proc.returncode != 0:
        print(f"optirack-slurm-hook: scontrol show job {job}: {proc.stderr.strip()}", file=sys.stderr)
        return 0
    try:
        alloc = read(job, proc.stdout)
    except AllocationError as e:
        set_comment(job, f"optirack: not regrouped: {e}")
        return 0
    if not any(alloc.nodes.values()):
        return 0  # no GPU: nothing to wire
    hold = args.fragmented == "hold" or HOLD_WORD in alloc.comment
    body = {"slurm_job": job, "user": os.environ.get("SLURM_JOB_USER") or alloc.user,
            "nodes": {n: idx for n, idx in alloc.nodes.items() if idx},
            "hold": hold, "policy": "fixed" if FIXED_WORD in alloc.comment else "regroup"}
    try:
        job_view = client.post("/slurm/jobs", body)
    except ApiError as e:
        if e.status == 0:
            set_comment(job, f"optirack: not regrouped, runs as Slurm placed it: {e.message}", alloc.comment)
            return 1 if args.unreachable == "fail" else 0
        if e.status == 409 and hold:
            set_comment(job, f"optirack: held until its GPUs can be regrouped: {e.message}", alloc.comment)
            return 1  # slurmctld requeues a batch job whose PrologSlurmctld fails
        set_comment(job, f"optirack: not regrouped, runs as Slurm placed it: {e.message}", alloc.comment)
        return 0
    set_comment(job, "optirack: " + job_view.get("note", "placed"), alloc.comment)
    return 0


def final_state(job: str) -> str:
    """How the job ended, as Slurm says it. While the epilog runs, scontrol says COMPLETING; the
    accounting record (sacct) has the end state a moment after; failing both, the exit code."""
    shown = scontrol("show", "job", job)
    state = next((f.split("=", 1)[1] for f in shown.stdout.split() if f.startswith("JobState=")), "")
    if state and state != "COMPLETING":
        return state
    reason = next((f.split("=", 1)[1] for f in shown.stdout.split() if f.startswith("Reason=")), "")
    for _ in range(5):
        proc = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", job], capture_output=True, text=True,
                              timeout=10)
        done = proc.stdout.strip().splitlines()
        if proc.returncode == 0 and done and done[-1] not in ("RUNNING", "PENDING", "REQUEUED", ""):
            return done[-1]
        time.sleep(0.1)
    if reason == "TimeLimit":
        return "TIMEOUT"
    return "COMPLETED" if os.environ.get("SLURM_JOB_EXIT_CODE2", "0:0") == "0:0" else "FAILED"


def epilog(args, client: Controller, job: str) -> int:
    state = final_state(job)
    try:
        client.post(f"/slurm/jobs/{job}/end", {"state": state})
    except ApiError as e:
        if e.status != 404:  # 404: the prolog never reached the controller; nothing is held
            print(f"optirack-slurm-hook: job {job}: circuits not released: {e}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="optirack-slurm-hook", description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=["prolog", "epilog"], help="PrologSlurmctld or EpilogSlurmctld")
    p.add_argument("--url", help="the controller (default $OPTIRACK_URL or http://127.0.0.1:8080)")
    p.add_argument("--token-file",
                   help="the controller's token (default $OPTIRACK_TOKEN_FILE or /var/lib/optirack/token)")
    p.add_argument("--fragmented", choices=["run", "hold"], default="run",
                   help="no switch can take all the job's GPUs: run fragmented, or requeue until one can "
                   "(a job asks for hold itself with --comment optirack:hold) (%(default)s)")
    p.add_argument("--unreachable", choices=["run", "fail"], default="run",
                   help="the controller cannot be reached: run as Slurm placed it, or requeue (%(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    job = os.environ.get("SLURM_JOB_ID", "")
    if not job:
        print("optirack-slurm-hook: SLURM_JOB_ID is not set (slurmctld runs this as PrologSlurmctld/EpilogSlurmctld)",
              file=sys.stderr)
        return 2
    client = Controller(args.url, find_token(token_file=args.token_file), timeout=TIMEOUT_S)
    return (prolog if args.kind == "prolog" else epilog)(args, client, job)


if __name__ == "__main__":
    sys.exit(main())
