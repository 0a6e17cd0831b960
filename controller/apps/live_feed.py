"""What the live page is sent: a first full picture of the rack, then only what changed (no Ryu, no I/O)."""
from __future__ import annotations

import json

from controller.apps import views

PORT_HISTORY = 300  # throughput samples per GPU port in the first message
ITERATION_HISTORY = 1000  # iterations per job in the first message
JOBS_SHOWN = 20
EVENTS_SHOWN = 50


class Feed:
    """One page's view of the controller: `next()` returns the parts that changed since its last call."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._sent: dict[str, str] = {}  # part -> JSON last sent
        self._port_t: dict[str, float] = {}  # gpu -> time of the last sample sent
        self._iterations: dict[str, int] = {}  # job -> iterations sent
        self._complete: set[str] = set()  # ended jobs whose every iteration was sent

    def _changed(self, key: str, value) -> bool:
        text = json.dumps(value, sort_keys=True, default=str)
        if self._sent.get(key) == text:
            return False
        self._sent[key] = text
        return True

    def next(self) -> dict:
        ctx = self.ctx
        msg: dict = {"t": round(ctx.clock(), 3)}
        rack = views.topology(ctx)
        if self._changed("rack", rack):
            msg["rack"] = rack
        circuits = ctx.circuits.to_json()
        if self._changed("circuits", circuits):
            msg["circuits"] = circuits
        jobs = self._jobs()
        msg["jobs"] = {}
        for j in jobs:
            if j.id in self._complete:
                continue  # ended, and sent as it ended
            summary = j.to_json()
            if self._changed("job:" + j.id, summary):
                msg["jobs"][j.id] = summary
        msg["job_order"] = [j.id for j in jobs]
        msg["iterations"] = self._new_iterations(jobs)
        msg["ports"] = self._new_samples()
        msg["events"] = [e.to_json() for e in ctx.events.recent(EVENTS_SHOWN)
                         if self._changed(f"event:{e.id}", [e.status, e.flows_confirmed_at, e.dark_end])]
        return msg

    def _jobs(self) -> list:
        jobs = sorted(self.ctx.jobs.jobs.values(), key=lambda j: (not j.active, -j.created_at))
        return jobs[:JOBS_SHOWN]

    def _new_iterations(self, jobs) -> dict[str, list]:
        out = {}
        for job in jobs:
            if job.id in self._complete:
                continue
            its = job.iterations()
            start = max(self._iterations.get(job.id, 0), len(its) - ITERATION_HISTORY)
            if its[start:]:
                out[job.id] = [
                    [round(i["t_end"], 3), round(i["iter_s"], 4), round(i["gpu_util"], 3)] for i in its[start:]
                ]
            self._iterations[job.id] = len(its)
            if not job.active:
                self._complete.add(job.id)
        return out

    def _new_samples(self) -> dict[str, list]:
        ctx, out = self.ctx, {}
        for name, g in ctx.rack.gpus.items():
            ref = g.nic.ocs_port
            last = self._port_t.get(name)
            samples = ctx.ports.history(ctx.rack.ocs[ref.device].dpid, ref.port, 10 if last else PORT_HISTORY)
            new = [s for s in samples if last is None or s.t > last]
            if new:
                # Seen at the OCS port: what it receives, the NIC transmitted.
                out[name] = [[round(s.t, 3), round(s.rx_bps), round(s.tx_bps)] for s in new]
                self._port_t[name] = new[-1].t
        return out
