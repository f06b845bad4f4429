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
