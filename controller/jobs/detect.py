"""The failure detector, and the threads that watch the world and only post what they see.

Threads: the ticker (a Tick every TICK s) and the engine watcher, which asks the engine of every server under an active
job every SERVER_POLL s (every server every `engine_poll` s) and posts an EngineChanged when one stops answering or
answers again. The OCS app posts a LinkChanged for a GPU's NIC (service.link_changed).

Decisions, in the loop, from what the book has observed of each rank (its lines, read by its follower: a worker prints
a heartbeat every 0.1 s besides its iterations, containers/worker.py):
- silent: a rank with no line for SILENT_S is suspect; its server's engine is probed (PROBE_TIMEOUT). One that does not
  answer within it, while its workers are silent, is a hung server: down, and its GPUs lost (sure signs), well before
  the engine client's own timeout. A refused engine is seen by the watcher sooner still.
- hung: a rank silent for a longer deadline (HUNG_FACTOR times its recent median iteration, at least HUNG_MIN_S) while
  its engine answers is a hung worker: lost as a killed one is (restarted on its own GPU, or swapped for a spare of its
  model if one is free).
- lagging: a rank whose recent median compute time is STRAGGLER_FACTOR times its job's other ranks' is a straggler,
  still progressing: named in the job's record (`lagging`) and on the live page, never swapped.
- an engine down, a link down: every GPU of the job there is lost (sure); a server that answers again is swept of what
  it ran (its stale workers stopped, fenced out) before its GPUs are free again; an external job's scheduler is told
  (SchedulerPort) that its node is lost, and back.
"""

from __future__ import annotations

import statistics

from controller.core.jobs import Job
from controller.jobs.actions import Actions
from controller.jobs.book import JobBook
from controller.jobs.inbox import Done, Drain, EngineChanged, Inbox, LinkChanged, Lost
from controller.jobs.ports import RETURNING, ContainersPort, SchedulerPort
from controller.jobs.runtime import Runtime
from controller.jobs.steps import LOG
from controller.jobs.workers import Workers

TICK = 0.1  # seconds between two ticks
SERVER_POLL = 0.5  # seconds between two pings of the engines under active jobs
SILENT_S = 0.5  # a rank with no line this long is suspect (five heartbeats missed)
PROBE_TIMEOUT = 0.3  # a suspect rank's engine must answer within this long, or its server is hung
HUNG_MIN_S = 5.0  # a rank silent this long (at least) while its engine answers is a hung worker
HUNG_FACTOR = 4.0  # ... or this many times its recent median iteration time, if longer
STRAGGLER_FACTOR = 2.0  # a rank whose recent median compute time is this many times the other ranks' lags
STRAGGLER_SAMPLES = 3  # iterations of each rank before it is judged


class Detector:
    def __init__(self, book: JobBook, inbox: Inbox, rt: Runtime, containers: ContainersPort,
                 scheduler: SchedulerPort | None = None, engine_poll: float = 2.0):
        self.book, self.inbox, self.rt, self.containers, self.scheduler = book, inbox, rt, containers, scheduler
        self.workers = Workers(book, containers, inbox, rt)
        self.actions = Actions(book, inbox, rt)
        self.engine_poll = engine_poll
        self.probing: set[str] = set()  # servers whose engine a probe is asking now
        self.answered: dict[str, float] = {}  # server -> when its engine last answered a probe
        self.sweeping: set[str] = set()

    # --- the threads ----------------------------------------------------------------------------
    def start(self) -> None:
        self.rt.spawn(self._ticker)
        self.rt.spawn(self._watch)

    def _ticker(self) -> None:
        from controller.jobs.inbox import Tick

        while True:
            self.rt.sleep(TICK)
            self.inbox.post(Tick())

    def _watch(self) -> None:
        """Ping engines and post what they say that the book does not know yet: a server down it holds up, a server
        answering again that it holds down (a sweep under way is not started twice: engine_changed)."""
        pinging: set[str] = set()
        waited = self.engine_poll

        def ping(server: str) -> None:
            try:
                up = self.containers.engines.ping(server)
                if not up and server not in self.containers.engines.returning() and server not in self.book.down:
                    why = self.containers.down_servers().get(server, "it does not answer")
                    self.inbox.post(EngineChanged(server, False, why))
            finally:
                pinging.discard(server)

        while True:
            self.rt.sleep(SERVER_POLL)
            waited += SERVER_POLL
            try:
                servers = {self.book.rack.server_of[g] for j in self.book.jobs.values()
                           if j.state in ("running", "recovering") for g in j.gpus}
                if waited >= self.engine_poll:
                    servers, waited = set(self.book.rack.servers), 0.0
                for server in sorted(servers - pinging):
                    pinging.add(server)
                    self.rt.spawn(ping, server)
                for server in self.containers.engines.returning():
                    if self.book.down.get(server) != RETURNING:
                        self.inbox.post(EngineChanged(server, True, RETURNING))
            except Exception:  # noqa: BLE001 (the watch goes on)
                LOG.exception("watching the engines")

    # --- engines and links ------------------------------------------------------------------------
    def engine_changed(self, ev: EngineChanged) -> None:
        if not ev.up:
            if self.book.down.get(ev.server) not in (None, RETURNING):
                return  # known down already
            self.book.down[ev.server] = ev.why
            self._lose_server(ev.server, f"the Docker Engine of server {ev.server} went down ({ev.why})")
            return
        self.book.down[ev.server] = RETURNING
        self._sweep(ev.server)

    def _lose_server(self, server: str, why: str) -> None:
        for job in self.book.of("containers", "running", "recovering"):
            for g in [g for g in job.gpus if self.book.rack.server_of[g] == server]:
                self.inbox.post(Lost(job.id, g, why, sure=True))
        for job in self.book.of("external", "running"):  # its scheduler runs its ranks: it is told
            if self.scheduler is not None and any(self.book.rack.server_of[g] == server for g in job.gpus):
                self.actions.start(job.id, "detect.told_scheduler", self.scheduler.node_lost,
                                   job.request["external"]["job"], server, why, tracked=False)

    def _sweep(self, server: str) -> None:
        if server in self.sweeping:
            return
        self.sweeping.add(server)
        self.actions.start(server, "detect.swept", self.workers.sweep, server, tracked=False)

    def swept(self, done: Done) -> None:
        server = done.job  # a sweep's Done names its server
        self.sweeping.discard(server)
        if done.error is not None:
            LOG.error("cannot remove stale containers on %s: %s", server, done.error)
            return  # still returning: the next tick tries again
        if done.result:
            LOG.warning("removed stale containers of GPUs %s on %s", ", ".join(done.result), server)
        self.containers.engines.mark_up(server)
        self.book.down.pop(server, None)
        self.answered[server] = self.book.clock()
        if self.scheduler is not None:
            self.actions.start(server, "detect.told_scheduler", self.scheduler.node_back, server, tracked=False)
        self.inbox.post(Drain())  # its GPUs can take queued jobs again

    def told_scheduler(self, done: Done) -> None:
        if done.error is not None:
            LOG.error("telling the scheduler about %s: %s", done.job, done.error)

    def link_changed(self, ev: LinkChanged) -> None:
        if ev.up:
            self.book.links_down.discard(ev.port)
            return
        self.book.links_down.add(ev.port)
        gpu = next((g for g in self.book.rack.gpus if str(self.book.rack.gpu_port(g)) == ev.port), None)
        for job in self.book.of("containers", "running", "recovering"):
            if gpu is not None and gpu in job.gpus:
                self.inbox.post(Lost(job.id, gpu, f"the link of {gpu}'s NIC ({ev.port}) went down", sure=True))

    # --- silent, hung, lagging ---------------------------------------------------------------------
    def tick(self, _=None) -> None:
        now = self.book.clock()
        for server, why in list(self.book.down.items()):
            if why == RETURNING and server not in self.sweeping:
                self._sweep(server)  # a sweep that failed: again
        for job in [j for j in self.book.of("containers", "running") if j.id not in self.book.ending]:
            for g in job.gpus:
                rank = self.book.rank(job, g)
                if rank is None or rank.ended or rank.alive_at is None:
                    continue  # not armed before its first line: a starting worker imports its framework
                silent, server = now - rank.alive_at, self.book.rack.server_of[g]
                if silent < SILENT_S or server in self.book.down:
                    continue
                stale = self.answered.get(server, 0.0) < max(rank.alive_at + SILENT_S, now - 1.0)
                if server not in self.probing and stale:
                    self.probing.add(server)
                    self.actions.start(server, "detect.probed", self._probe, server, tracked=False)
                elif silent >= self._hung_after(job, g) and self.answered.get(server, 0.0) > rank.alive_at:
                    why = f"the worker on {g} printed nothing for {silent:.1f} s while its server answers (hung)"
                    rank.ended = True  # one sign of it
                    self.inbox.post(Lost(job.id, g, why, sure=True, killed=True))
            self._lagging(job)

    def _probe(self, server: str) -> bool:
        return self.containers.engines.answers(server, PROBE_TIMEOUT)

    def probed(self, done: Done) -> None:
        server = done.job  # a probe's Done names its server
        self.probing.discard(server)
        if done.error is None and done.result:
            self.answered[server] = self.book.clock()
            return
        if server in self.book.down:
            return
        why = f"its workers are silent and its engine did not answer within {PROBE_TIMEOUT:g} s (hung)"
        LOG.error("server %s is lost: %s", server, why)
        self.containers.engines.mark_down(server, why)
        self.inbox.post(EngineChanged(server, False, why))

    def _hung_after(self, job: Job, gpu: str) -> float:
        rank = self.book.rank(job, gpu)
        median = rank.median_iter_s() if rank is not None else None
        return max(HUNG_MIN_S, HUNG_FACTOR * median) if median else HUNG_MIN_S

    def _lagging(self, job: Job) -> None:
        ranks = {g: r for g in job.gpus if (r := self.book.rank(job, g)) is not None
                 and len(r.compute_s) >= STRAGGLER_SAMPLES}
        if len(ranks) < 2:
            return
        medians = {g: r.median_compute_s() or 0.0 for g, r in ranks.items()}
        lagging = {}
        for g, m in medians.items():
            others = statistics.median(x for h, x in medians.items() if h != g)  # the job's other ranks
            if others > 0 and m >= STRAGGLER_FACTOR * others:
                lagging[g] = (f"rank {job.gpus.index(g)} on {g}: compute {m:.2f} s per iteration, {m / others:.1f}x "
                              f"the other ranks' median ({others:.2f} s)")
        if set(lagging) != set(job.lagging):
            if lagging:
                LOG.warning("%s: straggler(s): %s", job.id, "; ".join(lagging.values()))
            job.lagging = lagging
