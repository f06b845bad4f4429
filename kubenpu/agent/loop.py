"""The running agent's loop. Two workers: the `poll` thread moves ring-buffer records into the
Tally; the `attribution` thread reads the kernel's counters, attributes the Tally's counts to pods,
reads the registered sources every `interval` (kubenpu.sources: each through its Report) and
reaps dead cgroups. No exception stops either: each iteration is guarded, and Health reports a
worker that died anyway. kubenpu.agent.wiring builds it with its collaborators.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from kubenpu.agent.health import Health
from kubenpu.kernel.errors import ProbeError
from kubenpu.metrics.own import KERNEL_READ_FAILED, PINNED, STAMPS
from kubenpu.services import Streak, Worker
from kubenpu.sources.base import Finishes, Reads, Report, Sees, Source, Ticks
from kubenpu.sources.calls.events import Tally
from kubenpu.sources.calls.probe import Probe

if TYPE_CHECKING:
    from kubenpu.metrics.series import Series
    from kubenpu.resolve.resolver import Resolver
    from kubenpu.sources.calls.attribution import Attributor

log = logging.getLogger("kubenpu")


# A poll returns at the ring buffer's first record; its timeout bounds only how soon the poll
# thread sees a stop (within _JOIN_SECONDS) and stamps its health (stale after STALE_AFTER):
# 1 wakeup a second at idle.
_POLL_MS = 1000
_FLUSH_SECONDS = 0.5  # first sightings and per-event tallies: new pods resolved at once
# A CRI answer for held counts starts a flush before _FLUSH_SECONDS, at most this often: the
# answers that come meanwhile are taken by the same flush.
_ANSWERS_EVERY_SECONDS = 0.1
# Aggregate mode reads the kernel's counts this often: its cost grows with the number of keys,
# not with the call rate, and scrapes and pushes (15 s by default) see counts at most this old.
_READ_SECONDS = 5.0
# A new key's first sighting brings the next read forward to this long after the last: a new
# pod's first calls show within about a second, and pods starting at once cost one read a second.
_NEW_KEY_READ_SECONDS = 1.0
_REAP_SECONDS = 5.0
# Liveness fails when the kernel's counters were last read longer ago than this many reads.
_STALE_READS = 3
STALE_AFTER = _STALE_READS * _READ_SECONDS  # Health's stale_after
# The workers finish their step within this after the stop signal, or are left behind (daemon
# threads): with the 1 s the main loop takes to notice and agent._STOP_SECONDS, exit takes <= 29 s.
_JOIN_SECONDS = 3.0


class Agent:
    """The running agent: one thread polls the kernel, another attributes and counts."""

    def __init__(
        self,
        *,
        probe: Probe,
        tally: Tally,
        attributor: Attributor,
        metrics: Series,
        resolver: Resolver,
        health: Health,
        devices: int,
        sources: Sequence[Source] = (),
        interval: float = 5.0,
        answered: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.probe = probe
        self.tally = tally
        self.attributor = attributor
        self.metrics = metrics
        self.resolver = resolver
        self.health = health
        self._devices = devices
        self.sources = list(sources)
        self._interval = interval
        # The reads this loop runs (a source reading on its own thread has its own Report).
        self._reports = {
            s.name: Report(s.name, metrics, clock=clock, wall=wall)
            for s in sources
            if isinstance(s, (Reads, Finishes))
        }
        self._clock = clock
        self._wall = wall  # the Unix time of reads, for kubenpu_counters_read_timestamp_seconds
        self._counts_at: float | None = None  # of the last read that brought calls
        self.stop = threading.Event()
        self._answered = answered or threading.Event()  # set by the resolver's on_answer
        self._last_counts = self._last_reap = self._last_sources = -float("inf")
        self._new_keys = False  # sighted since the last counts read
        self._reads = Streak("reading the kernel's counters", log)
        self._steps = {
            "poll": Streak("poll", log),
            "attribution": Streak("attribution", log),
        }

    def run(self) -> int:
        """Attach, count until `stop`, then count a last time. Stopping the probe, resolver and
        exporters is the Services group's (build() registered them)."""
        self.attach()
        workers = [
            Worker("poll", self._poll_loop),
            Worker("attribution", self._attribute_loop),
        ]
        for worker in workers:
            self.health.watch(worker)
            worker.start()
        # After the workers start: a slow or unreachable runtime must not delay counting.
        log.info("container runtime: %s", self.resolver.runtime_version() or "unreachable")
        while not self.stop.wait(1.0):  # a timeout keeps signal handlers running promptly
            pass
        self._answered.set()  # the attribution thread stops waiting for answers
        stuck = _join(workers, _JOIN_SECONDS)
        if "attribution" in stuck:  # a last cycle would race the wedged one
            log.error(
                "%s did not stop within %g s of the stop signal: exiting without the last "
                "count; the exporters still make their final push",
                ", ".join(stuck),
                _JOIN_SECONDS,
            )
        else:
            self._guarded("attribution", self._last_cycle)
        return 0

    def attach(self) -> None:
        """Load and attach the probe. Raises ProbeError."""
        attach = self.probe.start()
        self.metrics.set(PINNED, "", int(self.probe.pinned))
        self.health.attached()
        log.info(
            "probe attached: %s, probe.mode %s; counting %d device(s)",
            attach,
            self.probe.mode,
            self._devices,
        )

    def _poll_loop(self) -> None:
        while not self.stop.is_set():
            if not self._guarded("poll", self.probe.poll, _POLL_MS):
                self.stop.wait(_POLL_MS / 1000)  # a poll that fails at once must not spin
            self.health.polled()

    def _attribute_loop(self) -> None:
        # The first cycle at once: an adopted probe's totals are exported without a wait, and
        # the counts held for a CRI answer as soon as it comes.
        # One wait a cycle at idle (the stop sets `answered` too): each wakeup is Python work
        # that an idle node pays; a second wait only after an answer cut the first short.
        while True:
            began = time.monotonic()
            self._guarded("attribution", self.cycle)
            self._answered.wait(_FLUSH_SECONDS)
            self._answered.clear()
            rest = _ANSWERS_EVERY_SECONDS - (time.monotonic() - began)
            if self.stop.is_set() or (rest > 0 and self.stop.wait(rest)):
                return

    def _guarded(self, worker: str, step: Callable[..., object], *args: object) -> bool:
        try:
            step(*args)
        except Exception as exc:  # no exception may stop counting; it is logged instead
            self._steps[worker].failed(exc)
            return False
        self._steps[worker].ok()
        return True

    def cycle(self) -> None:
        """One attribution step: read the kernel (the counts map every _READ_SECONDS, or
        _NEW_KEY_READ_SECONDS after a new key), count what the Tally holds, read the sources every
        `interval` in the registry's order (then tick those that hand work to a thread of their
        own: telemetry, after fdinfo's read) and reap dead cgroups every _REAP_SECONDS."""
        now = self._clock()
        self._new_keys = self._new_keys or self.tally.sighted()
        since = now - self._last_counts
        counts_due = since >= _READ_SECONDS or (self._new_keys and since >= _NEW_KEY_READ_SECONDS)
        timed = self._read(counts_due) and counts_due
        if timed:
            self._last_counts, self._new_keys = now, False
        self._flush()
        if timed:  # after the flush: the read's new keys are counted, so their series exist
            self._timed()
        if now - self._last_sources >= self._interval:
            self._last_sources = now
            self._read_sources()
        if now - self._last_reap >= _REAP_SECONDS:
            self._reap()
            self._last_reap = now

    def _last_cycle(self) -> None:
        """The calls made since the last cycle, and every held one, before exit."""
        self._read(counts=True)
        self._flush()
        for source in self.sources:
            if isinstance(source, Finishes):
                self._reports[source.name].read(source.finish)
        self.attributor.settle_all()
        self._timed()

    def _read_sources(self) -> None:
        for source in self.sources:
            if isinstance(source, Reads):
                self._reports[source.name].read(source.read)
        for source in self.sources:
            if isinstance(source, Ticks):  # a hand-over that never waits, not a read
                self._guarded("attribution", source.tick)

    def _read(self, counts: bool) -> bool:
        at = self._wall()
        try:
            self.probe.read(counts)
        except (ProbeError, OSError) as exc:
            self.metrics.set(KERNEL_READ_FAILED, "", 1)
            self._reads.failed(exc)
            return False
        self._reads.ok()
        self.health.kernel_read()
        if counts or self.probe.mode == "events":  # events mode: calls come at every flush
            self._counts_at = at
        return True

    def _reap(self) -> None:
        dead = self.attributor.dead_cgroups()
        # A removed cgroup has no process left, so after this read its counts are final and
        # forgetting it (here and in the kernel map) loses no call. No read, no forgetting.
        if not dead or not self._read(counts=True):
            return
        self._flush()
        self._timed()  # the gone cgroups' last totals
        self.probe.forget(self.attributor.forget(dead))

    def _timed(self) -> None:
        """The kernel's durations and remote calls to their series; the keys nothing will claim
        leave its map."""
        self.attributor.placed(self.probe.remote)
        if orphans := self.attributor.timed(self.probe.durations):
            self.probe.forget(orphans)

    def _flush(self) -> None:
        batch = self.tally.drain()
        for source in self.sources:
            if isinstance(source, Sees):
                source.saw(batch.tgids, {key.cgroup_id for key in batch.counts})
        try:
            self.attributor.flush(batch)
        finally:  # what an exception left uncounted is counted at the next flush
            self.tally.put_back(batch.counts)
        if self._counts_at is not None:  # the calls of that read are all counted now
            self.metrics.set(STAMPS, "kernel", self._counts_at)


def _join(workers: list[threading.Thread], seconds: float) -> list[str]:
    """Join the workers within `seconds` in all; the names of those still running."""
    deadline = time.monotonic() + seconds
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    return [w.name for w in workers if w.is_alive()]
