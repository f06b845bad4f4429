"""Liveness and readiness (/healthz, /readyz) from what the agent's workers report."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Health:
    """Liveness and readiness for /healthz and /readyz."""

    def __init__(self, stale_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._stale_after = stale_after
        self._clock = clock
        self._workers: list[threading.Thread] = []
        self._attached = False
        self._last_read: float | None = None
        self._last_poll: float | None = None

    def watch(self, worker: threading.Thread) -> None:
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
        dead = [w.name for w in self._workers if not w.is_alive()]
        if dead:
            return False, f"worker thread stopped: {', '.join(dead)}"
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
