"""The probe stage: turns what the kernel side counted into Tally increments, in the kernel's
probe mode. The kernel side itself (loading, pinning, reading maps) is kubenpu/kernel/; tests
replace it with tests/fakes.py's FakeKernel.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kubenpu.kernel.loader import Kernel
from kubenpu.kernel.records import Durations
from kubenpu.metrics.catalogue import Drop
from kubenpu.sources.calls.events import BadRecord, Birth, Deltas, Key, Tally, birth

log = logging.getLogger(__name__)


class Probe:
    """Feeds a Tally with what the kernel counted, in the kernel's probe mode.

    - ``aggregate``: ring-buffer records are first sightings; `read()` turns the counts map into
      increments.
    - ``events``: each ring-buffer record is one call; there is no map to read.
    In both modes `read()` turns the kernel's `lost` counters into increments. A record that
    cannot be decoded is skipped and counted as a `bad_record` drop. Birth records (a new cgroup,
    both modes) go to `on_births` on the polling thread, all those of one poll at once, after
    the poll's calls are in the Tally: a flood of births costs one scan per parent directory,
    not one per birth, and delays no call.
    """

    def __init__(
        self,
        kernel: Kernel,
        tally: Tally,
        on_births: Callable[[list[Birth]], None] | None = None,
    ) -> None:
        self._kernel = kernel
        self._tally = tally
        self._on_births = on_births
        self._births: list[Birth] = []  # of the poll in progress
        self._aggregate = kernel.aggregate
        self.mode = "aggregate" if kernel.aggregate else "events"
        self._counts: Deltas[Key] = Deltas()
        self._lost: Deltas[str] = Deltas()
        self._bad_records = 0
        # The kernel's call durations, cumulative, as of the last counts read (empty where the
        # kernel times nothing), and the calls of each key made from another NUMA node than
        # the device's, of the same read.
        self.durations: dict[Key, Durations] = {}
        self.remote: dict[Key, int] = {}

    def start(self) -> str:
        """Load and attach the program; returns the attach used. Raises ProbeError."""
        return self._kernel.start(self._on_record)

    @property
    def pinned(self) -> bool:
        """Whether the started program outlives the agent (pinned in bpffs)."""
        return self._kernel.pinned

    def _on_record(self, data: bytes) -> None:
        # Runs inside BCC's ctypes callback, where an exception would only be printed.
        try:
            if (born := birth(data)) is not None:
                if self._on_births is not None:
                    self._births.append(born)
            elif self._aggregate:
                self._tally.add_sighting(data)
            else:
                self._tally.add_event(data)
        except Exception as exc:
            self._tally.drop(Drop.BAD_RECORD)
            self._bad_records += 1
            if self._bad_records == 1 or not isinstance(exc, BadRecord):
                log.warning("ring-buffer record skipped (counted as bad_record): %s", exc)

    def poll(self, timeout_ms: int) -> None:
        """Deliver pending records to the Tally, waiting up to timeout_ms for the first; then
        the poll's births to on_births."""
        try:
            self._kernel.poll(timeout_ms)
        finally:  # a poll that failed midway: the births it delivered are still indexed
            births, self._births = self._births, []
            if births and self._on_births is not None:
                self._on_births(births)

    def read(self, counts: bool = True) -> None:
        """Add the kernel counters' increments to the Tally: in aggregate mode the counts map
        and the lost slots only if `counts`, in events mode the lost slots at every read.
        Raises ProbeError or OSError; nothing is lost then, the next read has the totals."""
        if not self._aggregate or counts:  # aggregate: lost beside the counts they miss
            self._tally.kernel_lost(self._lost.step(self._kernel.read_lost()))
        if self._aggregate and counts:
            self._tally.add_counts(self._counts.step(self._kernel.read_counts()))
            self.remote = self._kernel.read_remote()
            self.durations = self._kernel.read_durations()

    def forget(self, keys: list[Key]) -> None:
        """Free the kernel entries (counts and durations) of cgroups that are gone (no process
        can add to them)."""
        if self._aggregate:
            self._kernel.forget_counts(keys)
            self._counts.forget(keys)
            for key in keys:  # not handed on again before the next read
                self.durations.pop(key, None)
                self.remote.pop(key, None)

    def close(self) -> None:
        self._kernel.close()
