"""Descriptor exhaustion (EMFILE, ENFILE): counted by where it hit, logged once a streak.

A read that fails for want of a descriptor says nothing about what it read (a cgroup that
exists, a process that holds a DRM client): callers count it here and treat what they could not
read as unknown, never as gone. The metrics server's connection cap leaves room below the soft
limit (kubenpu.export.server.max_open), so this should not happen; when it does it is visible.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_EXHAUSTED = (errno.EMFILE, errno.ENFILE)
# Where descriptors ran out: the metric's `where` label values.
CGROUP_WALK = "cgroup_walk"
FDINFO = "fdinfo"
METRICS_SERVER = "metrics_server"
WHERE = (CGROUP_WALK, FDINFO, METRICS_SERVER)


def exhausted(error: OSError) -> bool:
    """Whether error means the process (EMFILE) or the system (ENFILE) has no descriptor left."""
    return error.errno in _EXHAUSTED


class Exhaustion:
    """One place's exhaustion: each failure counted (on_count(where, n)), the first of a
    streak logged, and the end of the streak. Thread-safe."""

    def __init__(self, where: str, on_count: Callable[[str, int], None] | None = None) -> None:
        self.where = where
        self._on_count = on_count
        self._lock = threading.Lock()
        self._streak = 0
        self.total = 0

    def failed(self, n: int = 1) -> None:
        if n <= 0:
            return
        with self._lock:
            first = self._streak == 0
            self._streak += n
            self.total += n
        if first:
            log.warning(
                "%s: out of file descriptors (EMFILE/ENFILE); what could not be read is "
                "retried, not taken as gone (kubenpu_descriptors_exhausted_total)",
                self.where,
            )
        if self._on_count is not None:
            self._on_count(self.where, n)

    def ok(self) -> None:
        """A pass of the work with no exhaustion: the streak is over."""
        with self._lock:
            streak, self._streak = self._streak, 0
        if streak:
            log.info("%s: descriptors available again after %d failure(s)", self.where, streak)
