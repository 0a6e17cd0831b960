"""A runtime on virtual time, for unit tests of the controller that must not wait on the wall clock.

It implements controller/jobs/runtime.py's interface with greenlets and a clock of its own: a spawned thread runs
when the test lets the runtime run (`run(until=...)`, `advance(seconds)`), a sleep parks its thread until the
virtual clock reaches its end, and when every thread is parked the clock jumps to the next wake-up. Nothing here
sleeps for real: a test that uses it may patch `time.sleep` and `hub.sleep` to raise (the `no_wall_clock`
fixture). The same test gives the same interleaving every time.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging

import greenlet

LOG = logging.getLogger("tests.virtual")


class Stuck(AssertionError):
    """What the test waits for cannot happen: every thread is parked for good, or the virtual time ran out."""


class _Wait:
    """One parked greenlet's wake-up (fires once; `value` is what the waker handed over)."""

    __slots__ = ("g", "fired", "value")

    def __init__(self, g):
        self.g, self.fired, self.value = g, False, None


class _Task:
    def __init__(self, rt: VirtualRuntime, fn, args, raise_error: bool):
        self.rt, self.fn, self.args, self.raise_error = rt, fn, args, raise_error
        self.done, self.result, self.error = False, None, None
        self.waiters: list[_Wait] = []
        self.g = greenlet.greenlet(self._main, parent=rt.main)

    def _main(self):
        try:
            self.result = self.fn(*self.args)
        except greenlet.GreenletExit:
            pass
        except BaseException as e:  # noqa: BLE001 (kept for whoever waits; logged if nobody will)
            self.error = e
            if not self.raise_error:
                LOG.error("thread %s raised", getattr(self.fn, "__qualname__", self.fn), exc_info=e)
                self.rt.crashed.append(e)
        finally:
            self.done = True
            for w in self.waiters:
                self.rt.wake(w)

    def wait(self):
        if not self.done:
            w = _Wait(greenlet.getcurrent())
            self.waiters.append(w)
            self.rt.park(w)
        if self.error is not None and self.raise_error:
            raise self.error
        return self.result


class _Lock:
    def __init__(self, rt: VirtualRuntime):
        self.rt, self.held, self.waiters = rt, False, collections.deque()

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        if not self.held:
            self.held = True
            return True
        if not blocking:
            return False
        w = _Wait(greenlet.getcurrent())
        self.waiters.append(w)
        if timeout is not None:
            self.rt.timer(timeout, w)
        if self.rt.park(w):
            return True  # handed over by release(): still held, now by us
        self.waiters.remove(w)
        return False

    def release(self) -> None:
        if not self.held:
            raise RuntimeError("release of a lock nobody holds")
        while self.waiters:
            w = self.waiters.popleft()
            if not w.fired:
                self.rt.wake(w, True)
                return
        self.held = False

    def locked(self) -> bool:
        return self.held

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


class _Event:
    def __init__(self, rt: VirtualRuntime):
        self.rt, self.flag, self.waiters = rt, False, []

    def set(self) -> None:
        self.flag = True
        for w in self.waiters:
            self.rt.wake(w, True)
        self.waiters = []

    def clear(self) -> None:
        self.flag = False

    def is_set(self) -> bool:
        return self.flag

    def wait(self, timeout: float | None = None) -> bool:
        if self.flag:
            return True
        w = _Wait(greenlet.getcurrent())
        self.waiters.append(w)
        if timeout is not None:
            self.rt.timer(timeout, w)
        if not self.rt.park(w) and w in self.waiters:
            self.waiters.remove(w)
        return self.flag


class VirtualRuntime:
    def __init__(self, start: float = 1_700_000_000.0):
        self.now = start
        self.main = greenlet.getcurrent()  # the test's: it runs the scheduler
        self.crashed: list[BaseException] = []  # errors of threads spawned without raise_error
        self._ready: collections.deque[_Wait] = collections.deque()
        self._timers: list[tuple[float, int, _Wait]] = []
        self._seq = itertools.count()
        self._tasks: list[_Task] = []

    # --- the interface (controller/jobs/runtime.py) ---------------------------------------------
    def clock(self) -> float:
        return self.now

    def spawn(self, fn, *args, raise_error: bool = False) -> _Task:
        task = _Task(self, fn, args, raise_error)
        self._tasks.append(task)
        start = _Wait(task.g)
        start.fired = True
        self._ready.append(start)
        return task

    def joinall(self, threads) -> None:
        for t in list(threads):
            t.wait()

    def sleep(self, seconds: float) -> None:
        if greenlet.getcurrent() is self.main:
            self.advance(seconds)
            return
        w = _Wait(greenlet.getcurrent())
        self.timer(max(0.0, seconds), w)
        self.park(w)

    def lock(self) -> _Lock:
        return _Lock(self)

    def event(self) -> _Event:
        return _Event(self)

    # --- the scheduler ------------------------------------------------------------------------------
    def timer(self, seconds: float, w: _Wait) -> None:
        heapq.heappush(self._timers, (self.now + seconds, next(self._seq), w))

    def wake(self, w: _Wait, value=None) -> None:
        if w.fired:
            return
        w.fired, w.value = True, value
        if w.g is not self.main:
            self._ready.append(w)

    def park(self, w: _Wait):
        """Give the others the turn until `w` fires; what its waker handed over."""
        if greenlet.getcurrent() is self.main:
            self.run(until=lambda: w.fired, what="a wait of the test itself")
        else:
            self.main.switch()
        return w.value

    def _step(self, horizon: float) -> bool:
        """Run one ready thread, or else move the clock to the next wake-up not after `horizon`; False if neither."""
        if self._ready:
            self._ready.popleft().g.switch()
            return True
        while self._timers and self._timers[0][2].fired:
            heapq.heappop(self._timers)  # woken by something else before its time (a lock, an event)
        if self._timers and self._timers[0][0] <= horizon:
            when, _, w = heapq.heappop(self._timers)
            self.now = max(self.now, when)
            self.wake(w)
            return True
        return False

    def run(self, until, timeout: float = 3600.0, what: str = "a condition") -> None:
        """Let the threads run, the clock jumping from wake-up to wake-up, until `until()` holds. Raises Stuck if it
        cannot: nothing left to run, or `timeout` seconds of virtual time gone."""
        assert greenlet.getcurrent() is self.main, "run() belongs to the test, not to a thread"
        horizon = self.now + timeout
        while not until():
            if not self._step(horizon):
                raise Stuck(f"{what} never came: " + ("every thread is parked" if not self._timers else
                                                      f"not within {timeout:g} s of virtual time"))
            if self.crashed:
                raise self.crashed[0]

    def advance(self, seconds: float) -> None:
        """Let `seconds` of virtual time pass, every thread running as it would."""
        end = self.now + seconds
        while self._step(end):
            pass
        self.now = max(self.now, end)

    def close(self) -> None:
        """End every thread still parked (as a killed process's threads end), so none is left for later tests."""
        for task in self._tasks:
            if not task.done and task.g:
                task.g.throw(greenlet.GreenletExit)
        self._ready.clear()
        self._timers.clear()
