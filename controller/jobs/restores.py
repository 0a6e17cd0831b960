"""Which checkpoint a recovery goes on from: the newest iteration of which a copy survives on a GPU still in the job
(each rank saves one on its own server and one on a peer's on another server: containers/checkpoint.py), and where each
rank restores it from: its own server's copy if it wrote one, else any surviving holder's (the replicas hold the same
state). Pure: read from the job's reports."""

from __future__ import annotations

from controller.core.jobs import Job
from controller.core.rack import Rack


def newest_checkpoint(job: Job, rack: Rack, survivors: list[str]) -> tuple[int, dict[str, list[str]]]:
    """The newest iteration with a copy on a surviving GPU's server, and its copies: writer -> holders."""
    address = {rack.addresses[g][0]: g for g in rack.gpus}
    copies: dict[int, dict[str, list[str]]] = {}
    for g in job.reports:
        for r in job.reports[g]:
            if r.get("event") != "checkpoint":
                continue
            writer = r.get("writer", g)
            holders = [writer, address.get((r.get("peer") or "").partition(":")[0])]
            alive = [h for h in holders if h in survivors]
            if alive:
                held = copies.setdefault(r["iteration"], {}).setdefault(writer, [])
                copies[r["iteration"]][writer] = sorted(set(held) | {h for h in alive if h is not None})
    if not copies:
        return 0, {}
    k = max(copies)
    return k, copies[k]


def restores_for(job: Job, rack: Rack, survivors: list[str]) -> dict[str, tuple[int, str, str]]:
    """GPU -> (the checkpoint's iteration, where to restore it from: "local" or a holder's NIC address, its writer),
    for every GPU of the job; empty when no checkpoint survives (every rank starts from iteration 0)."""
    k, copies = newest_checkpoint(job, rack, survivors)
    if k == 0:
        return {}
    out = {}
    for g in job.gpus:
        if g in copies and g in copies[g]:
            out[g] = (k, "local", g)
        else:
            writer = sorted(copies)[0]
            out[g] = (k, rack.addresses[copies[writer][0]][0], writer)
    return out
