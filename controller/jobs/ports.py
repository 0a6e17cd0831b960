"""What the job service needs of the world, as interfaces, with their errors and value types: the controller's wiring
(controller/apps/context.py) hands in the real parts (controller/devices/changes.py, controller/drivers/), a unit test
hands in fakes (tests/unit/jobfakes.py). The drivers implement these; the job service imports nothing of them.
Besides the ports, the service's parts get the job book (book.py), the inbox (inbox.py), the runtime (runtime.py) and
the clock."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from controller.core.circuits import CircuitMap
from controller.core.events import ReconfigEvent

CHECKPOINTS = "/checkpoints"  # where a worker finds its server's volume of the job's checkpoints
RETURNING = "it answers again; its stale containers are being removed"  # why a server that is back is still down


class ContainerError(RuntimeError):
    """A GPU's containers could not be started, told or removed; the message names the GPU and its server."""


class EngineDown(RuntimeError):
    """A server's engine does not answer; the message names the server, its engine and why."""

    def __init__(self, server: str, url: str, why: str):
        self.server, self.url, self.why = server, url, why
        super().__init__(f"the Docker Engine of server {server} ({url}) is down: {why}")


@dataclass
class GpuContainer:
    """What a containers port needs to start one GPU's container."""

    job: str
    gpu: str
    server: str
    gpu_index: int
    gpu_model: str
    ifname: str  # the NIC's interface name
    cidr: str  # address/prefix for the NIC
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


class CircuitChangesPort(Protocol):
    """The one way circuits change (controller/devices/changes.py: the OCS and the packet switches, confirmed)."""

    def change(
        self,
        plan: Callable[[CircuitMap], CircuitMap | None],
        kind: str,
        reason: str | Callable[[], str],
        job: str | None = None,
        wait: float | None = 0,
        note: str | Callable[[], str] = "",
    ) -> ReconfigEvent | None:
        """Under the reconfiguration lock: `plan(current)`, and the map it returns applied (all or nothing); the event,
        or None when nothing changed. `plan` may raise to refuse. Raises Busy (no lock in `wait` s), ReconfigFailed
        (the devices refused: rolled back), OcsUnavailable."""
        ...

    def ready(self) -> bool:
        """Whether every OCS is connected and holds our circuits."""
        ...

    def switching_time_s(self, ocs: str, circuits_made: int) -> float:
        """What OCS `ocs` promises for a change that makes `circuits_made` circuits."""
        ...


class EnginesPort(Protocol):
    def ping(self, server: str) -> bool:
        """Whether the server's Docker Engine answers now (a server that is back but not yet swept: False); records
        a server that does not answer as down, with the reason."""
        ...

    def answers(self, server: str, timeout: float) -> bool:
        """Whether the engine answers within `timeout` s; records nothing (the failure detector's probe)."""
        ...

    def mark_down(self, server: str, why: str) -> None:
        """Record the server down (the failure detector found it hung)."""
        ...

    def returning(self) -> list[str]:
        """Servers shown down whose engine answers again (to be swept before they are used)."""
        ...

    def mark_up(self, server: str) -> None: ...


class ContainersPort(Protocol):
    """One container per GPU on its server's engine (controller/drivers/containers.py)."""

    image: str

    @property
    def engines(self) -> EnginesPort:
        """The servers' engines: which answer now."""
        ...

    def check_engines(self, servers: Iterable[str]) -> None:
        """Raise EngineDown naming the first server whose engine does not answer."""
        ...

    def down_servers(self) -> dict[str, str]:
        """Servers whose engine did not answer when last asked: server -> why."""
        ...

    def worker_image(self, server: str) -> str: ...

    def start(self, spec: GpuContainer, image: str | None = None, reuse: bool = False) -> str:
        """Start the worker of a GpuContainer spec (its sandbox and NIC too, unless `reuse`)."""
        ...

    def logs(self, job: str, gpu: str, server: str) -> Iterator[bytes]:
        """The worker's output as it comes, until it exits."""
        ...

    def tail(self, job: str, gpu: str, server: str, lines: int) -> list[str]: ...

    def wait(self, job: str, gpu: str, server: str) -> int:
        """The worker's exit code, once it exited."""
        ...

    def kill(self, job: str, gpu: str, server: str) -> None: ...

    def regroup(self, job: str, gpu: str, server: str, attempt: int, argv: list[str]) -> None:
        """Tell a running worker to leave its ring and join the attempt's new one with `argv`; raises if it cannot."""
        ...

    def remove(self, job: str, gpu: str, server: str) -> None:
        """The NIC given back, the worker and its sandbox removed (safe to repeat)."""
        ...

    def workers(self, server: str, job: str | None = None) -> list[dict]:
        """The containers there (of `job`): dicts with job, gpu, role, status."""
        ...

    def remove_volume(self, job: str, server: str) -> None: ...

    def sweep(self, server: str, keep_jobs: set[str], keep_gpus: set[tuple[str, str]] | None = None) -> list[str]:
        """Remove what is there of jobs not in `keep_jobs` (and of GPUs not in `keep_gpus`); the GPUs removed."""
        ...


class AggregatorsPort(Protocol):
    """The switches' in-network aggregators (controller/devices/fabric.py: through the switch)."""

    def end_aggregation(self, switch: str, key: int) -> bool:
        """Tell `switch`'s aggregator that the job of `key` there is over (its slots freed now); whether it went."""
        ...


class SchedulerPort(Protocol):
    """The outside scheduler of external jobs (Slurm: controller/slurm/): what the job service tells it and asks it."""

    def node_lost(self, job: str, server: str, why: str) -> None:
        """A server under external job `job` (the scheduler's job id) is dead: mark its node down with the reason now,
        so the scheduler ends the job's steps and requeues it (if it asked) without waiting for its own timeout."""
        ...

    def node_back(self, server: str) -> None:
        """The server answers again: resume its node (only if we marked it down)."""
        ...

    def ended(self, jobs: list[str]) -> dict[str, str]:
        """Of these scheduler job ids, those that ended, with their final state as the scheduler says."""
        ...
