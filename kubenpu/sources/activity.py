"""Signals of use per container and device, from the stages that see them: submit-class calls
(kubenpu.sources.calls.attribution) and engine busy time (kubenpu.sources.usage). Allocations
compares them between refreshes to find idle allocations and unallocated use, so they never
read the export store.

A container's signals are dropped `ttl` seconds after it is gone (as its metric series are), so
its unallocated-use series is exported a while longer, then retires.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

User = tuple[str, str, str, str]  # namespace, pod, container, device
Use = tuple[int, float]  # submit-class calls, engine busy seconds plus cycles


class Activity:
    """Cumulative use per User; thread safe (attribution, usage and allocations threads)."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._use: dict[User, Use] = {}
        self._gone: dict[tuple[str, str, str], float] = {}  # container -> when it went

    def submitted(self, user: User, n: int) -> None:
        """n submit-class calls."""
        with self._lock:
            calls, busy = self._use.get(user, (0, 0.0))
            self._use[user] = (calls + n, busy)
            self._gone.pop(user[:3], None)

    def busy(self, user: User, amount: float) -> None:
        """An increment of engine busy seconds or busy cycles."""
        with self._lock:
            calls, busy = self._use.get(user, (0, 0.0))
            self._use[user] = (calls, busy + amount)
            self._gone.pop(user[:3], None)

    def gone(self, namespace: str, pod: str, container: str) -> None:
        """The container's cgroup is gone: its signals go after `ttl` unless it is seen again."""
        with self._lock:
            self._gone.setdefault((namespace, pod, container), self._clock())

    def snapshot(self) -> dict[User, Use]:
        """Every User's use so far, without the containers gone longer than `ttl`."""
        with self._lock:
            now = self._clock()
            expired = {c for c, t in self._gone.items() if now - t >= self._ttl}
            if expired:
                self._use = {u: v for u, v in self._use.items() if u[:3] not in expired}
                for c in expired:
                    del self._gone[c]
            return dict(self._use)
