"""A recovery's assessment, pure: from the job, its recovery record so far (the signs gathered) and the world as
observed (servers down, links down), which GPUs are lost now, which of them may take their own rank again, which
workers only failed on their own, and the attempt the plan is for (recovery.py takes it at step `assessed`, and again
whenever a loss is found later in the recovery)."""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet

from controller.core import spares as spare_rule
from controller.core.jobs import Job
from controller.core.rack import Rack


def losses(job: Job, rec: dict, rack: Rack, down: Mapping[str, str], links_down: AbstractSet[str]) -> dict[str, str]:
    """The job's GPUs lost now, with why: a sure sign, a server observed down, a link down."""
    out = {g: s[0] for g, s in rec["signs"].items() if s[1] and g in job.gpus}
    for g in job.gpus:
        s = rack.server_of[g]
        if s in down:
            out.setdefault(g, f"the Docker Engine of server {s} is down ({down[s]})")
        elif str(rack.gpu_port(g)) in links_down:
            out.setdefault(g, f"the link of {g}'s NIC went down")
    return out


def newly_lost(job: Job, rec: dict, rack: Rack, down: Mapping[str, str], links_down: AbstractSet[str]) -> list[str]:
    """GPUs of the job lost now that the current plan does not already replace, or restarts in place on a server that
    has died since."""
    handled = set(rec.get("lost", {})) if rec["step"] != "detected" else set()
    restarting = set(rec.get("restarted", {}))
    return sorted(g for g in losses(job, rec, rack, down, links_down)
                  if g not in handled or (g in restarting and rack.server_of[g] in down))


def assess(job: Job, rec: dict, rack: Rack, down: Mapping[str, str], links_down: AbstractSet[str], now: float) -> None:
    """Update `rec` to step `assessed`: the GPUs lost (cumulative in the recovery) and losing now, the restartable
    ones (spares.restartable: killed on a live server, not restarted so in an earlier recovery), the workers' own
    errors, the servers down, the iterations reached, the new attempt."""
    lost_now = losses(job, rec, rack, down, links_down)
    servers_down = sorted({rack.server_of[g] for g in job.gpus} & set(down))
    killed = [g for g, s in rec["signs"].items() if s[2]]
    links = [g for g in job.gpus if str(rack.gpu_port(g)) in links_down]
    previous = [g for r in job.recoveries for g in r.get("restarted", {})]
    first = next(iter(rec["signs"].values()))[0] if rec["signs"] else job.reason
    reached = max((r["iteration"] + 1 for g in job.gpus for r in job.reports.get(g, [])
                   if r.get("event") == "iteration" and r.get("attempt", 0) == job.attempt), default=0)
    rec.pop("stopped", None)
    rec.update(
        step="assessed", attempt=job.attempt + 1, reason=rec.get("reason") or first, old_gpus=list(job.gpus),
        lost={**rec.get("lost", {}), **lost_now},
        losing={g: lost_now[g] for g in job.gpus if g in lost_now},
        restartable=spare_rule.restartable([g for g in job.gpus if g in lost_now], killed, servers_down, links,
                                           rack.server_of, previous),
        errors={g: s[0] for g, s in rec["signs"].items() if not s[1] and g in job.gpus and g not in lost_now},
        servers_down=servers_down, reached=max(reached, rec.get("reached", 0)), spares={}, restarted={},
    )
    rec.setdefault("assessed_at", now)
