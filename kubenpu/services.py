"""The agent's pieces as one service group, the way Kepler runs its services: each piece's stop
is registered as the piece starts, and one stop path stops them all, the last started first,
under one deadline (as the OTel SDK's reader shuts down once, with one timeout)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType

log = logging.getLogger(__name__)


class Services:
    """A context manager around starting and running the pieces: leaving it, by a return or by
    any failure (a piece that cannot start), stops what had started."""

    def __init__(
        self, deadline_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._deadline_seconds = deadline_seconds
        self._clock = clock
        self._stops: list[tuple[str, Callable[[], object]]] = []

    def add(self, name: str, stop: Callable[[], object]) -> None:
        """Register a piece's stop before the piece starts: one whose start fails half way (a
        probe that loaded but could not attach) is stopped too."""
        self._stops.append((name, stop))

    def __enter__(self) -> Services:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Stop every piece, the last registered first, all within the one deadline. A piece
        that fails or overruns is logged and the others still stop."""
        deadline = self._clock() + self._deadline_seconds
        while self._stops:
            name, stop = self._stops.pop()
            if not _stopped_within(stop, deadline - self._clock()):
                log.warning(
                    "%s did not stop within the %g s stop deadline; exiting without waiting",
                    name,
                    self._deadline_seconds,
                )


def _stopped_within(stop: Callable[[], object], seconds: float) -> bool:
    """Runs `stop` on a daemon thread, so an overrun cannot hold the process past the deadline."""

    def run() -> None:
        try:
            stop()
        except Exception:  # the other pieces must still stop
            log.exception("stopping failed")

    worker = threading.Thread(target=run, name="stop", daemon=True)
    worker.start()
    worker.join(max(seconds, 0.0))
    return not worker.is_alive()


class Streak:
    """The log of a step a service repeats: the first failure of a streak and the recovery,
    not every repeat (a sysfs read or a kernel read failing each second would flood it)."""

    def __init__(self, what: str, logger: logging.Logger) -> None:
        self._what = what
        self._log = logger
        self._failures = 0

    def failed(self, exc: BaseException) -> None:
        self._failures += 1
        if self._failures == 1:
            self._log.error("%s failed (retrying): %s: %s", self._what, type(exc).__name__, exc)

    def ok(self) -> None:
        if self._failures:
            self._log.info("%s works again after %d failure(s)", self._what, self._failures)
            self._failures = 0


class Worker(threading.Thread):
    """A thread of the agent's, watched by Health by its name: one that ends by an exception,
    a lasting one that ends at all, or one that stops beating (`beat()`: once an iteration) for
    longer than `stale_after` seconds fails liveness, with one log line when it ends. The agent's
    stop ends them too, and the process exits then."""

    def __init__(
        self,
        name: str,
        target: Callable[[], object],
        *,
        lasting: bool = True,
        stale_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._step = target
        self._lasting = lasting
        self._stale_after = stale_after
        self._clock = clock
        self._beat = clock()
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._step()
        except BaseException as exc:  # a thread's end is said, whatever ended it
            self.failure = exc
            log.error("thread %s stopped: %s: %s", self.name, type(exc).__name__, exc)

    def beat(self) -> None:
        self._beat = self._clock()

    def broken(self) -> str | None:
        """Why liveness fails for this thread, or None."""
        if not self.is_alive() and self.ident is not None:
            if self.failure is not None:
                return f"worker thread stopped: {self.name} ({type(self.failure).__name__})"
            return f"worker thread stopped: {self.name}" if self._lasting else None
        age = self._clock() - self._beat
        if self._stale_after is not None and age > self._stale_after:
            return f"worker thread stalled: {self.name} (no step for {age:.0f} s)"
        return None
