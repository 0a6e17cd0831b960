"""How the controller runs concurrent work: threads, sleeping, locks, events. The controller hands in the eventlet
runtime of Ryu's hub (controller/apps/runtime.py, the one module that calls the hub); tests hand in one whose clock
they drive (tests/unit/virtual.py), so that nothing waits on the wall clock."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol


class Handle(Protocol):
    def wait(self) -> Any:
        """Wait until the thread ended; its result, or (spawned with `raise_error`) its exception."""


class Lock(Protocol):
    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool: ...

    def release(self) -> None: ...

    def locked(self) -> bool: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: Any) -> Any: ...


class Event(Protocol):
    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False if `timeout` seconds passed first."""


class Runtime(Protocol):
    def spawn(self, fn: Callable[..., Any], *args: Any, raise_error: bool = False) -> Handle:
        """Run `fn(*args)` concurrently; returns a handle for `wait` and `joinall`. With `raise_error`, an exception in
        `fn` reaches whoever waits for it; without, it is logged."""

    def joinall(self, threads: Iterable[Handle]) -> None:
        """Wait until every one of `threads` has ended (re-raising the error of one spawned with `raise_error`)."""

    def sleep(self, seconds: float) -> None:
        """Let the others run for `seconds`."""

    def lock(self) -> Lock:
        """A lock for one holder at a time (a context manager, with acquire(blocking, timeout), release(), locked())."""

    def event(self) -> Event:
        """A flag threads can wait on."""
