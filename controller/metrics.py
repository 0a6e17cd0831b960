"""Prometheus metrics, read from the controller's state when scraped: no per-packet work.

Port counters come from the port-statistics replies the monitor app already asks for (the metrics app hands them in);
job, circuit and device figures are read from the parts the controller's wiring built (controller/apps/context.py) at
scrape time; histograms take each completed reconfiguration and iteration once, when a scrape first sees it. The
metrics app (controller/apps/metrics.py) serves them at GET /metrics.
"""
from __future__ import annotations

import contextlib
import logging

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

LOG = logging.getLogger("optirack.metrics")
STATES = ("queued", "pending", "configuring", "running", "recovering", "done", "failed", "stopped")
ITERATION_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
RECONFIG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Reconfiguration kinds (core.events) whose series exist from the start, so the first one is seen as an increase.
KINDS = ("circuits", "restore", "job", "regroup", "failover")
KEEP_ENDED_JOB_S = 600.0  # a finished job's series stay this long after it ended


class Metrics:
    """The registry behind /metrics: a collector over the context, plus the histograms and counters it feeds."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.counters: dict[tuple[int, int], object] = {}  # (dpid, port) -> latest OFPPortStats
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "optirack_rest_requests",
            "REST requests answered, by route template, method and status",
            ["route", "method", "code"],
            registry=self.registry,
        )
        self.iteration = Histogram(
            "optirack_job_iteration_seconds",
            "Time of one training iteration of a job (slowest rank, emulated seconds)",
            ["job_id"],
            buckets=ITERATION_BUCKETS,
            registry=self.registry,
        )
        self.dark = Histogram(
            "optirack_reconfiguration_dark_window_seconds",
            "Time the changed circuits were dark during a reconfiguration",
            ["kind"],
            buckets=RECONFIG_BUCKETS,
            registry=self.registry,
        )
        self.overhead = Histogram(
            "optirack_reconfiguration_control_overhead_seconds",
            "Reconfiguration time from the request to confirmed forwarding, minus the OCS switching time",
            ["kind"],
            buckets=RECONFIG_BUCKETS,
            registry=self.registry,
        )
        self.reconfigs = Counter(
            "optirack_reconfigurations",
            "Reconfigurations that ended, by kind and status",
            ["kind", "status"],
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self))
        for kind in KINDS:
            self.dark.labels(kind)
            self.overhead.labels(kind)
            for status in ("ok", "failed"):
                self.reconfigs.labels(kind, status)
        # What already happened before this controller started (a restored log) is not observed again.
        self._seen_events = {e.id for e in ctx.events.recent() if e.status != "running"}
        self._iterations_seen: dict[str, int] = {}
        self._util: dict[str, float] = {}
        self._finished: set[str] = set()
        self._forgotten: set[str] = set()
        for job in self._jobs():
            self._iterations_seen[job.id] = len(job.iterations())
            if not job.active:
                self._finished.add(job.id)

    # --- fed by the apps -----------------------------------------------------------------
    def port_stats(self, dpid: int, stats) -> None:
        self.counters[(dpid, stats.port_no)] = stats

    def count_request(self, route_path: str, method: str, status: int) -> None:
        self.requests.labels(route_path, method, str(status)).inc()

    def render(self) -> bytes:
        self.observe_new()
        return generate_latest(self.registry)

    # --- histograms: each completed event and iteration observed once --------------------
    def _jobs(self) -> list:
        return list(self.ctx.jobs.jobs.values())

    def observe_new(self) -> None:
        events = self.ctx.events.recent()
        for ev in events:
            if ev.status == "running" or ev.id in self._seen_events:
                continue
            self._seen_events.add(ev.id)
            self.reconfigs.labels(ev.kind, ev.status).inc()
            if ev.status == "ok" and ev.dark_window_s is not None:
                self.dark.labels(ev.kind).observe(ev.dark_window_s)
            if ev.status == "ok" and ev.total_s is not None:
                self.overhead.labels(ev.kind).observe(max(0.0, ev.total_s - ev.switching_time_s))
        self._seen_events &= {ev.id for ev in events}
        now = self.ctx.clock()
        for job in self._jobs():
            if job.id in self._finished:
                if job.ended_at is not None and now - job.ended_at > KEEP_ENDED_JOB_S and job.id not in self._forgotten:
                    self._forgotten.add(job.id)
                    self._util.pop(job.id, None)
                    with contextlib.suppress(KeyError):
                        self.iteration.remove(job.id)
                continue
            its = job.iterations()
            for it in its[self._iterations_seen.get(job.id, 0) :]:
                self.iteration.labels(job.id).observe(it["iter_s"])
            self._iterations_seen[job.id] = len(its)
            if its:
                self._util[job.id] = its[-1]["gpu_util"]
            if not job.active:
                self._finished.add(job.id)

    def shown_jobs(self) -> list:
        now = self.ctx.clock()
        return [
            j for j in self._jobs() if j.active or (j.ended_at is not None and now - j.ended_at <= KEEP_ENDED_JOB_S)
        ]


class _StateCollector:
    """Gauges and port counters read from the context at scrape time."""

    def __init__(self, metrics: Metrics):
        self.m = metrics

    def describe(self):
        return []  # read at scrape time; nothing to describe up front

    def collect(self):
        yield from self._ports()
        yield from self._uplinks()
        yield from self._devices()
        yield from self._jobs()

    def _ports(self):
        ctx, m = self.m.ctx, self.m
        labels = ["gpu", "server", "ocs_port"]
        fams = {
            k: CounterMetricFamily(
                f"optirack_gpu_port_{k}",
                f"{k.replace('_', ' ').capitalize()} of a GPU's NIC, counted at the OCS port facing it",
                labels=labels,
            )
            for k in ("transmit_bytes", "receive_bytes", "transmit_packets", "receive_packets")
        }
        for name, g in ctx.rack.gpus.items():
            ref = g.nic.ocs_port
            s = m.counters.get((ctx.rack.ocs[ref.device].dpid, ref.port))
            if s is None:
                continue
            values = [name, ctx.rack.server_of[name], str(ref)]
            # The OCS receives what the NIC transmits.
            fams["transmit_bytes"].add_metric(values, s.rx_bytes)
            fams["receive_bytes"].add_metric(values, s.tx_bytes)
            fams["transmit_packets"].add_metric(values, s.rx_packets)
            fams["receive_packets"].add_metric(values, s.tx_packets)
        yield from fams.values()

    def _uplinks(self):
        ctx, m = self.m.ctx, self.m
        tx = CounterMetricFamily(
            "optirack_uplink_transmit_bytes",
            "Bytes a packet switch sent out of an uplink",
            labels=["switch", "port", "peer"],
        )
        rx = CounterMetricFamily(
            "optirack_uplink_receive_bytes",
            "Bytes a packet switch received on an uplink",
            labels=["switch", "port", "peer"],
        )
        for w in ctx.rack.spec.switches:
            for u in w.uplinks:
                s = m.counters.get((w.dpid, u.port))
                if s is not None:
                    tx.add_metric([w.name, str(u.port), str(u.peer)], s.tx_bytes)
                    rx.add_metric([w.name, str(u.port), str(u.peer)], s.rx_bytes)
        yield tx
        yield rx

    def _devices(self):
        ctx = self.m.ctx
        connected = GaugeMetricFamily(
            "optirack_device_connected",
            "1 while the controller holds a connection to the device",
            labels=["device", "kind"],
        )
        synced = GaugeMetricFamily(
            "optirack_device_synchronised",
            "1 once the device holds what the controller wants (circuits or forwarding)",
            labels=["device", "kind"],
        )
        circuits = GaugeMetricFamily("optirack_ocs_circuits", "Circuits the controller holds on an OCS", labels=["ocs"])
        for o in ctx.rack.spec.ocs:
            driver = ctx.ocs.drivers.get(o.name)
            connected.add_metric([o.name, "ocs"], float(bool(driver and driver.connected)))
            synced.add_metric([o.name, "ocs"], float(o.name in ctx.ocs.synchronised))
            circuits.add_metric([o.name], len(ctx.circuits.on(o.name)))
        for w in ctx.rack.spec.switches:
            connected.add_metric([w.name, "switch"], float(w.dpid in ctx.datapaths))
            synced.add_metric([w.name, "switch"], float(w.name in ctx.fabric.installed))
        yield from (connected, synced, circuits)

    def _jobs(self):
        m = self.m
        jobs = m._jobs()
        by_state = GaugeMetricFamily("optirack_jobs", "Jobs the controller knows, by state", labels=["state"])
        counts = dict.fromkeys(STATES, 0)
        for j in jobs:
            counts[j.state] = counts.get(j.state, 0) + 1
        for state, n in counts.items():
            by_state.add_metric([state], n)
        yield by_state
        util = GaugeMetricFamily(
            "optirack_job_gpu_utilization_ratio",
            "GPU utilization of a job in its latest iteration (0-1, mean over its GPUs)",
            labels=["job_id"],
        )
        spread = GaugeMetricFamily(
            "optirack_job_switches",
            "Aggregator switches a job's GPUs are spread over (1 when grouped)",
            labels=["job_id"],
        )
        gpu = GaugeMetricFamily(
            "optirack_gpu_job",
            "1 for each GPU a job holds (join on gpu to sum a job's ports)",
            labels=["gpu", "job_id", "switch"],
        )
        for j in m.shown_jobs():
            if j.id in m._util:
                util.add_metric([j.id], m._util[j.id])
            if j.active:
                spread.add_metric([j.id], len(j.switches))
        where = m.ctx.circuits.gpu_locations(m.ctx.rack)
        for j in jobs:
            if j.active:
                for g in j.gpus:
                    gpu.add_metric([g, j.id, where.get(g, ("none",))[0]], 1)
        yield from (util, spread, gpu)
