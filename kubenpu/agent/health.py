"""Liveness and readiness (/healthz, /readyz) from what the agent's workers report."""

from __future__ import annotations

import time
from collections.abc import Callable

from kubenpu.services import Worker


class Health:
    """Liveness and readiness for /healthz and /readyz."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after = stale_after
        self._clock = clock
        self._workers: list[Worker] = []
        self._attached = False
        self._last_read: float | None = None
        self._last_poll: float | None = None

    def watch(self, worker: Worker) -> None:
        """Watch a worker by its name: its end or stall fails liveness (Worker.broken)."""
        self._workers.append(worker)

    def attached(self) -> None:
        self._attached = True

    def kernel_read(self) -> None:
        self._last_read = self._clock()

    def polled(self) -> None:
        """The poll thread is back from a poll: a wedged one, in either mode, stops calling
        this while the attribution thread still reads the kernel's counters."""
        self._last_poll = self._clock()

    def live(self) -> tuple[bool, str]:
        broken = [why for w in self._workers if (why := w.broken())]
        if broken:
            return False, "; ".join(broken)
        for what, last in (
            ("kernel counters last read", self._last_read),
            ("ring buffer last polled", self._last_poll),
        ):
            if last is not None and (age := self._clock() - last) > self._stale_after:
                return False, f"{what} {age:.0f} s ago"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        if not self._attached:
            return False, "probe not attached yet"
        if self._last_read is None:
            return False, "kernel counters not read yet"
        return True, "ok"
