"""How the job service runs concurrent work: threads, sleeping, locks. The controller hands in the eventlet runtime
of Ryu's hub (controller/apps/runtime.py); tests can hand in one whose clock they drive."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Runtime(Protocol):
    def spawn(self, fn: Callable[..., Any], *args: Any, raise_error: bool = False) -> Any:
        """Run `fn(*args)` concurrently; returns a handle for `joinall`. With `raise_error`, an exception in `fn`
        reaches whoever joins it."""

    def joinall(self, threads: Iterable[Any]) -> None:
        """Wait until every one of `threads` has ended."""

    def sleep(self, seconds: float) -> None:
        """Let the others run for `seconds`."""

    def lock(self) -> AbstractContextManager[Any]:
        """A lock for one holder at a time (a context manager, with acquire() and release())."""
