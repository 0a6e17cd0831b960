"""Fakes for the job service's ports, free of Ryu: a container driver whose workers replay scripted JSON lines
(FakeDriver), and a circuit-change port that makes the plan's map the rack state's at once (FakeChanges). Job unit
tests build the job service from them, the rack state and the virtual runtime (`service`)."""
from __future__ import annotations

from pathlib import Path

from controller.core.circuits import CircuitMap
from controller.core.errors import Busy
from controller.jobs.service import JobService
from controller.state import RackState, open_store


def _hub_sleep(seconds):
    from ryu.lib import hub  # only for the tests that run on Ryu's hub (no virtual runtime handed in)

    hub.sleep(seconds)


class FakeContainer:
    def __init__(self, name, lines, code, block=False, stderr=(), sleep=None, labels=None):
        self.name, self.lines, self.code, self.block = name, lines, code, block
        self.sleep = sleep or _hub_sleep  # a virtual runtime's, or the hub's
        self.stderr = list(stderr)
        self.killed, self.removed, self.vanished = False, False, False
        self.labels = dict(labels or {})
        self.pace = 0.0
        self.pos = 0  # lines printed so far
        self.waiting = False  # a warm spare: it waits for its rank (a regroup) once its lines are printed
        self.hung = False  # stopped (SIGSTOP, or its whole server hung): prints nothing, never ends

    def _follow(self, data):
        self.pos = 0
        while True:
            while self.pos < len(self.lines):  # read as it goes: a regroup replaces the lines not yet printed
                if self.pace:  # one line per `pace` seconds (a worker that trains on the runtime's clock)
                    self.sleep(self.pace)
                    if self.killed:
                        return
                while self.hung and not self.killed:
                    self.sleep(0.01)
                if self.killed:
                    return
                if self.vanished:
                    raise ConnectionError("connection reset by peer")
                self.pos += 1
                yield (self.lines[self.pos - 1] + "\n").encode()
            if not self.waiting or self.killed:
                break
            self.sleep(0.01)  # a warm spare waiting for its rank
            if self.vanished:
                raise ConnectionError("connection reset by peer")
        while self.block and not self.killed:  # a worker that runs until it is killed
            self.sleep(0.01)
            if self.vanished:
                raise ConnectionError("connection reset by peer")

    def logs(self, stream=False, follow=False, stdout=True, stderr=True, tail="all", **_):
        data = [(line + "\n").encode() for line in self.lines]
        if stream:
            return self._follow(data)
        data += [(line + "\n").encode() for line in self.stderr] if stderr else []
        return b"".join(data if tail == "all" else data[-tail:])

    def wait(self, **_):
        while (self.block or self.waiting) and not self.killed and not self.vanished:
            self.sleep(0.01)
        if self.vanished:
            raise ConnectionError("connection reset by peer")
        return {"StatusCode": self.kill_code if self.killed else self.code}

    kill_code = 137

    def kill(self):
        self.killed = True


def _arg(command, flag, default=None):
    return command[command.index(flag) + 1] if flag in command else default

class FakeEngines:
    """Every engine answers unless a test marks its server down, or hung (it answers nothing: a ping times out)."""

    PING_TIMEOUT = 3.0  # as the engine client's (controller/drivers/engines.py)

    def __init__(self, sleep=None):
        self.down: dict[str, str] = {}
        self.back: set[str] = set()  # down servers answering again (shown down until swept)
        self._returning: set[str] = set()
        self.hung: set[str] = set()
        self.sleep = sleep

    def ping(self, server):
        from controller.jobs.ports import RETURNING
        if server in self.hung:
            self.sleep(self.PING_TIMEOUT)
            self.down[server] = "timed out"
            return False
        if server in self.down and server in self.back:
            self.down[server] = RETURNING
            self._returning.add(server)
        return server not in self.down

    def mark_down(self, server, why):
        self.down[server] = why

    def answers(self, server, timeout):
        if server in self.hung:
            self.sleep(timeout)
            return False
        return server not in self.down

    def returning(self):
        return sorted(self._returning)

    def mark_up(self, server):
        self.down.pop(server, None)
        self._returning.discard(server)
        self.back.discard(server)


class FakeDriver:
    """A container driver that runs no containers: each 'worker' replays scripted JSON lines.

    `faults`: {"client": exception} makes every engine call raise it (an engine that cannot be
    reached); {"start": exception or {gpu: exception}} makes starting (that GPU's) container raise.
    `stderr`: gpu -> lines its worker writes to stderr. `sleep`: how a blocked worker waits (default the hub's; a
    virtual runtime's in tests on virtual time)."""

    image = "optirack-worker:latest"

    def __init__(self, iterations=3, fail_start_on=None, exit_codes=None, block=False, faults=None, stderr=None,
                 sleep=None, pace=0.0):
        self.sleep = sleep
        self.pace = pace  # > 0: workers train as the command says (iterations, checkpoints, resume), one per `pace` s
        self.iterations, self.fail_start_on, self.exit_codes = iterations, fail_start_on, exit_codes or {}
        self.block = block
        self.faults = faults or {}
        self.stderr = stderr or {}
        self.running: dict[str, FakeContainer] = {}
        self.started, self.removed, self.volumes_removed, self.regrouped = [], [], [], []
        self.engines = FakeEngines(sleep)

    def _engine(self, server):
        if "client" in self.faults:
            raise self.faults["client"]
        if server in self.engines.hung:  # a call to a hung engine waits for the client's timeout
            self.sleep(self.engines.PING_TIMEOUT)
            raise TimeoutError(f"the engine of {server} did not answer (timed out)")

    def check_engines(self, servers):
        from controller.jobs.ports import EngineDown
        for s in sorted(servers):
            self._engine(s)
            if s in self.engines.down:
                raise EngineDown(s, f"tcp://{s}:2376", self.engines.down[s])

    def down_servers(self):
        return dict(self.engines.down)

    def worker_image(self, server):
        self._engine(server)
        return "registry:5000/optirack-worker@sha256:" + "0" * 64

    def start(self, spec, image=None, reuse=False):
        import json

        from controller.drivers.containers import container_name
        from controller.jobs.ports import ContainerError
        self._engine(spec.server)
        fault = self.faults.get("start")
        if isinstance(fault, dict):
            fault = fault.get(spec.gpu)
        if fault is not None:
            raise fault
        if spec.gpu == self.fail_start_on:
            raise ContainerError(f"cannot start the container of {spec.gpu}: no such image")
        if "--warm" in spec.command:  # a warm spare: it waits for its rank (regroup)
            lines = [json.dumps({"event": "warm"})]
        elif self.pace:
            lines = self._training(spec)
        else:
            lines = [json.dumps({"event": "iteration", "iteration": i, "t_start": 10.0 + i, "t_end": 11.0 + i,
                                 "compute_s": 0.6, "comm_s": 0.4, "iter_s": 1.0, "gpu_util": 0.6, "bytes": 1})
                     for i in range(self.iterations)]
            lines.append(json.dumps({"event": "done", "check": "ok"}))
        name = container_name(spec.job, spec.gpu)
        labels = {"job": spec.job, "gpu": spec.gpu, "server": spec.server}
        self.running[name] = FakeContainer(name, lines, self.exit_codes.get(spec.gpu, 0), self.block,
                                           self.stderr.get(spec.gpu, ()), self.sleep, labels)
        self.running[name].pace = self.pace
        self.running[name].waiting = "--warm" in spec.command
        self.started.append((spec.job, spec.gpu, spec.command))
        return name

    def _training(self, spec):
        """The lines a worker prints for its command: iterations from --resume-from, a checkpoint line every
        --checkpoint-every iterations (naming --checkpoint-peer), a restored line when it resumes."""
        import json

        cmd = spec.command
        total, start = int(_arg(cmd, "--iterations")), int(_arg(cmd, "--resume-from", 0))
        every, peer = int(_arg(cmd, "--checkpoint-every", 0)), _arg(cmd, "--checkpoint-peer")
        attempt = int(_arg(cmd, "--attempt", 0))  # every line of a real worker says its attempt
        lines = []
        if start:
            lines.append(json.dumps({"event": "restored", "iteration": start, "from": _arg(cmd, "--restore-from"),
                                     "writer": _arg(cmd, "--restore-writer"), "attempt": attempt}))
        for i in range(start, total):
            lines.append(json.dumps({"event": "iteration", "iteration": i, "t_start": 10.0 + i, "t_end": 11.0 + i,
                                     "compute_s": 0.6, "comm_s": 0.4, "iter_s": 1.0, "gpu_util": 0.6, "bytes": 1,
                                     "attempt": attempt}))
            if every and (i + 1) % every == 0 and i + 1 < total:
                lines.append(json.dumps({"event": "checkpoint", "iteration": i + 1, "writer": spec.gpu, "peer": peer,
                                         "attempt": attempt}))
        lines.append(json.dumps({"event": "done", "check": "ok", "attempt": attempt}))
        return lines

    def kill_server(self, server, why="connection refused"):
        """A server dies: its engine stops answering and its workers' streams break."""
        self.engines.down[server] = why
        for c in self.running.values():
            if c.labels.get("server") == server:
                c.vanished = True

    def _get(self, job, gpu, server):
        import docker

        from controller.drivers.containers import container_name
        self._engine(server)
        name = container_name(job, gpu)
        if name not in self.running:
            raise docker.errors.NotFound(name)
        return self.running[name]

    def logs(self, job, gpu, server):
        return self._get(job, gpu, server).logs(stream=True, follow=True)

    def tail(self, job, gpu, server, lines):
        return self._get(job, gpu, server).logs(stdout=True, stderr=True, tail=lines).decode().splitlines()

    def wait(self, job, gpu, server):
        return self._get(job, gpu, server).wait()["StatusCode"]

    def kill(self, job, gpu, server):
        self._get(job, gpu, server).kill()

    def regroup(self, job, gpu, server, attempt, argv):
        """A running worker told to join the attempt's new ring: from here it prints what `argv` makes it train
        (its lines saying the attempt, as a real worker's do)."""
        import json
        import types

        from controller.jobs.ports import ContainerError
        c = self._get(job, gpu, server)
        if c.killed or c.vanished or (c.pos >= len(c.lines) and not c.waiting):
            raise ContainerError(f"the worker of {gpu} has exited")
        c.waiting = False
        spec = types.SimpleNamespace(command=argv, gpu=gpu)
        c.lines = c.lines[:c.pos] + [json.dumps({**json.loads(line), "attempt": attempt})
                                     for line in self._training(spec)]
        self.regrouped.append((job, gpu, argv))

    def hang_server(self, server):
        """Every process of the server stopped, links up: nothing refused, nothing printed, nothing ends."""
        self.engines.hung.add(server)
        for c in self.running.values():
            if c.labels.get("server") == server:
                c.hung = True

    def wake_server(self, server):
        self.engines.hung.discard(server)
        self.engines.down.pop(server, None)
        for c in self.running.values():
            if c.labels.get("server") == server:
                c.hung = False

    def stop_worker(self, job, gpu, server):
        """SIGSTOP of one worker: it prints nothing more, its engine answers."""
        self._get(job, gpu, server).hung = True

    def kill9(self, job, gpu, server):
        """`kill -9` of one worker from outside: it exits 137 (the controller did not stop it)."""
        c = self._get(job, gpu, server)
        c.killed = True

    def remove(self, job, gpu, server):
        from controller.drivers.containers import container_name
        self.running.pop(container_name(job, gpu), None)
        self.removed.append((job, gpu))

    def workers(self, server, job=None):
        self._engine(server)
        return [
            {"job": c.labels["job"], "gpu": c.labels["gpu"], "role": "worker",
             "status": "exited" if c.killed or c.vanished or not (c.block or c.waiting or c.pos < len(c.lines))
             else "running"}
            for c in self.running.values() if c.labels.get("server") == server and job in (None, c.labels["job"])
        ]

    def remove_volume(self, job, server):
        self._engine(server)
        self.volumes_removed.append((job, server))

    def sweep(self, server, keep_jobs, keep_gpus=None):
        stale = sorted((w["job"], w["gpu"]) for w in self.workers(server) if w["job"] not in keep_jobs
                       or (keep_gpus is not None and (w["job"], w["gpu"]) not in keep_gpus))
        for job, gpu in stale:
            self.remove(job, gpu, server)
        return [g for _, g in stale]


class FakeAggregators:
    """The aggregators' port: what it was told, in order ((switch, key) of each job's end)."""

    def __init__(self):
        self.ended: list[tuple[str, int]] = []

    def end_aggregation(self, switch: str, key: int) -> bool:
        self.ended.append((switch, key))
        return True


class FakeChanges:
    """The circuit-change port without devices: under the rack state's lock, the plan's map becomes the state's at
    once, with its event (ok) saved with it. `ready` says whether the OCS are in step (True unless a test says)."""

    def __init__(self, state):
        self.state = state
        self.in_step = True
        self.made: list = []  # the events of the changes made

    def ready(self) -> bool:
        return self.in_step

    def switching_time_s(self, ocs: str, circuits_made: int) -> float:
        spec = self.state.rack.ocs[ocs]
        if circuits_made == 0:
            return 0.0
        return (spec.switching_time_ms if circuits_made == 1 else spec.bulk_time_ms) / 1000.0

    def change(self, plan, kind, reason, job=None, wait=0, note=""):
        state = self.state
        if not state.lock.acquire(blocking=wait != 0, timeout=wait or None):
            raise Busy("another reconfiguration is in progress; try again when it is done")
        try:
            target = plan(state.circuits)
            if target is None or target == state.circuits:
                return None
            diff = state.circuits.diff(target)
            now = state.clock()
            ev = state.events.start(
                kind,
                reason() if callable(reason) else reason,
                now,
                job=job,
                note=note() if callable(note) else note,
                removed=CircuitMap(diff.remove).to_json(),
                added=CircuitMap(diff.add).to_json(),
            )
            state.circuits = target
            ev.ocs_confirmed_at = ev.flows_confirmed_at = now
            ev.status, ev.version = "ok", state.circuits_version
            state.save(events=[ev])
            self.made.append(ev)
            return ev
        finally:
            state.lock.release()


def service(tmp_path: Path, rack, driver: FakeDriver, rt, engine_poll: float = 1.0, start: bool = True,
            keep_survivors: bool = False, queue: str = "fifo", scheduler=None):
    """The job service alone, as the controller's wiring builds it, from the rack state (over a store in
    `tmp_path`), a FakeChanges, `driver` and runtime `rt` (`queue`: its queue's discipline); a second one on the same
    `tmp_path` and a new runtime is a restart (the first one's threads never run again). `keep_survivors`: survivors
    regroup in their processes (FakeDriver.regroup) instead of being restarted; `scheduler`: the outside scheduler's
    port. The aggregators' port is a FakeAggregators (service.runs.aggregators). Returns (service, state, changes)."""
    driver.sleep = driver.engines.sleep = rt.sleep
    for container in driver.running.values():  # a restart on the same engines: their workers go on
        container.sleep = rt.sleep
    state = RackState(rack, open_store(Path(tmp_path), rack.name, rt.clock), rt.clock, rt.lock())
    changes = FakeChanges(state)
    jobs = JobService(state, changes, driver, rt, engine_poll=engine_poll, keep_survivors=keep_survivors,
                      queue=queue, scheduler=scheduler, aggregators=FakeAggregators())
    if start:
        jobs.start()
    return jobs, state, changes
