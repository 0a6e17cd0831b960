"""What the job service needs of the world, as interfaces: the controller's wiring (controller/apps/context.py) hands
in the real parts, a unit test hands in fakes (tests/unit/jobfakes.py). Besides these two ports the service gets the
rack state (controller/state.py) and the runtime (runtime.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from controller.core.circuits import CircuitMap
from controller.core.events import ReconfigEvent


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

    def ready(self) -> bool:
        """Whether every OCS is connected and holds our circuits."""

    def switching_time_s(self, ocs: str, circuits_made: int) -> float:
        """What OCS `ocs` promises for a change that makes `circuits_made` circuits."""


class EnginesPort(Protocol):
    def ping(self, server: str) -> bool:
        """Whether the server's Docker Engine answers now."""

    def returning(self) -> list[str]:
        """Servers shown down whose engine answers again (to be swept before they are used)."""

    def mark_up(self, server: str) -> None: ...


class ContainersPort(Protocol):
    """One container per GPU on its server's engine (controller/drivers/containers.py)."""

    image: str
    engines: EnginesPort

    def check_engines(self, servers) -> None:
        """Raise EngineDown naming the first server whose engine does not answer."""

    def down_servers(self) -> dict[str, str]:
        """Servers whose engine did not answer when last asked: server -> why."""

    def worker_image(self, server: str) -> str: ...

    def start(self, spec, image: str, reuse: bool = False) -> str:
        """Start the worker of a GpuContainer spec (its sandbox and NIC too, unless `reuse`)."""

    def logs(self, job: str, gpu: str, server: str) -> Iterator[bytes]:
        """The worker's output as it comes, until it exits."""

    def tail(self, job: str, gpu: str, server: str, lines: int) -> list[str]: ...

    def wait(self, job: str, gpu: str, server: str) -> int:
        """The worker's exit code, once it exited."""

    def kill(self, job: str, gpu: str, server: str) -> None: ...

    def regroup(self, job: str, gpu: str, server: str, attempt: int, argv: list[str]) -> None:
        """Tell a running worker to leave its ring and join the attempt's new one with `argv`; raises if it cannot."""

    def remove(self, job: str, gpu: str, server: str) -> None:
        """The NIC given back, the worker and its sandbox removed."""

    def workers(self, server: str, job: str | None = None) -> list[dict]:
        """The containers there (of `job`): dicts with job, gpu, role, status."""

    def remove_volume(self, job: str, server: str) -> None: ...

    def sweep(self, server: str, keep_jobs: set[str], keep_gpus: set[tuple[str, str]] | None = None) -> list[str]:
        """Remove what is there of jobs not in `keep_jobs` (and of GPUs not in `keep_gpus`); the GPUs removed."""
