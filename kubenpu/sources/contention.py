"""Blocked-by accounting of GPU job queue wait (docs/jobs.md, Who is in my way): the jobs
probe's per-step records (bpf/jobs.bpf.c job_events) replayed per ring in time order.

The rule: over each interval between two steps on a ring, each cgroup with w jobs waiting
(queued, not run) accrues w * dt of wait. Where jobs run on the ring, that wait is split over
the cgroups running them in proportion to their running jobs (evenly per running job); where
none runs, it is idle wait. In integer nanoseconds, with the parts of one interval's w * dt
cut at cumulative floors over the running cgroups in cgroup id order, so they sum to it
exactly: per (cgroup, ring), behind + idle == the sum of its jobs' waits (run, or done where
cancelled, minus queued), the kernel's wait_sum_ns for the same clock reads.

Records come from several CPUs, so they are replayed only once older than `margin_ns`: until
then they are held, sorted. One that comes older than what was already replayed (its ring's
frontier) is replayed at the frontier and counted `late`. Pure: no kernel, no clock of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from kubenpu.kernel.records import JobStep

QUEUED, RUN, DONE = 0, 1, 2
OTHER = -1  # the behind cgroup of a pair past the ring's cap
UNKNOWN = 0  # the cgroup of a job seen running that was not seen queued
MARGIN_NS = 100_000_000  # a record's delay from its clock read to the reader, at most
# Jobs in flight kept per ring, as the kernel's `jobs` LRU holds (bpf/jobs.bpf.c): past it the
# oldest is dropped, counted unmatched. A job whose run or done record was lost (events_full)
# would otherwise be held, and accrue, for good.
MAX_JOBS = 16384


Event = JobStep


@dataclass
class _Ring:
    addr: int  # the scheduler's address
    frontier: int | None = None  # replayed up to here (ns)
    jobs: dict[int, tuple[int, bool]] = field(default_factory=dict)  # fence -> (cgroup, running)
    waiting: Counter[int] = field(default_factory=Counter)
    running: Counter[int] = field(default_factory=Counter)
    pairs: set[tuple[int, int]] = field(default_factory=set)  # (waiter, behind) under the cap
    refused: set[tuple[int, int]] = field(default_factory=set)  # pairs past it, while they live


class Totals(NamedTuple):
    """What a take() hands over: nanoseconds since the last take."""

    behind: dict[tuple[int, int, int], int]  # (ring, waiter cgroup, behind cgroup or OTHER)
    idle: dict[tuple[int, int], int]  # (ring, waiter cgroup)


def split(total: int, running: Counter[int]) -> Iterable[tuple[int, int]]:
    """`total` ns over the running cgroups in proportion to their jobs: (cgroup, part), parts
    at cumulative floors in cgroup id order, so they sum to `total` exactly."""
    jobs, done, given = sum(running.values()), 0, 0
    for cgroup in sorted(running):
        done += running[cgroup]
        upto = total * done // jobs
        if upto > given:
            yield cgroup, upto - given
        given = upto


class Contention:
    """add() records as they are read; advance(now) replays those older than the margin and
    accrues every ring up to it; take() the nanoseconds since the last take."""

    def __init__(
        self, max_pairs: int = 16, margin_ns: int = MARGIN_NS, max_jobs: int = MAX_JOBS
    ) -> None:
        self._max_pairs = max_pairs
        self._max_jobs = max_jobs
        self._margin = margin_ns
        self._held: list[tuple[int, int, int, Event]] = []  # (ts, kind, seq, event)
        self._seq = 0
        self._rings: dict[int, _Ring] = {}
        self._behind: Counter[tuple[int, int, int]] = Counter()
        self._idle: Counter[tuple[int, int]] = Counter()
        self.late = 0  # records replayed at their ring's frontier, older than it
        self.unmatched = 0  # a run or done of a job not seen queued, or a fence queued twice
        self.capped = 0  # pairs refused by a full ring, each once (their time went to OTHER)
        # (ring, client id, cgroup) of queued jobs with a client id since the owner drained it
        self.clients: set[tuple[int, int, int]] = set()

    def add(self, events: Iterable[Event]) -> None:
        for e in events:
            self._held.append((e.ts_ns, e.kind, self._seq, e))
            self._seq += 1

    def advance(self, now_ns: int) -> None:
        """Replay the held records up to now_ns - margin, then every ring up to it."""
        horizon = now_ns - self._margin
        self._held.sort()
        cut = next((i for i, h in enumerate(self._held) if h[0] > horizon), len(self._held))
        ready, self._held = self._held[:cut], self._held[cut:]
        for _, _, _, event in ready:
            self._replay(event)
        for ring in self._rings.values():
            if ring.frontier is not None and ring.frontier < horizon:
                self._accrue(ring, horizon)

    def in_flight(self) -> int:
        """Jobs queued and not done, over all rings (and records held)."""
        return sum(len(r.jobs) for r in self._rings.values())

    def take(self) -> Totals:
        behind, idle = dict(self._behind), dict(self._idle)
        self._behind.clear()
        self._idle.clear()
        return Totals(behind, idle)

    def forget(self, cgroups: Iterable[int]) -> None:
        """Gone cgroups' pairs leave their rings' caps (their jobs are done or never will be)."""
        gone = set(cgroups)
        for ring in self._rings.values():
            ring.pairs = {p for p in ring.pairs if not gone.intersection(p)}
            ring.refused = {p for p in ring.refused if not gone.intersection(p)}

    def _replay(self, e: Event) -> None:
        ring = self._rings.setdefault(e.ring, _Ring(e.ring))
        ts = e.ts_ns
        if ring.frontier is not None and ts < ring.frontier:
            self.late += 1
            ts = ring.frontier
        self._accrue(ring, ts)
        job = ring.jobs.get(e.fence)
        if e.kind == QUEUED:
            if job is not None:  # its done was lost: the fence's memory was reused
                self.unmatched += 1
                self._drop(ring, e.fence)
            elif len(ring.jobs) >= self._max_jobs:
                self.unmatched += 1
                self._drop(ring, next(iter(ring.jobs)))
            ring.jobs[e.fence] = (e.cgroup_id, False)
            ring.waiting[e.cgroup_id] += 1
            if e.client_id:
                self.clients.add((e.ring, e.client_id, e.cgroup_id))
        elif e.kind == RUN:
            if job is None:  # queued before the probe attached (or its record lost)
                self.unmatched += 1
                job = (UNKNOWN, False)
            elif job[1]:  # run again (a driver's resubmission after a reset): already running
                self.unmatched += 1
                return
            else:
                self._drop(ring, e.fence)
            ring.jobs[e.fence] = (job[0], True)
            ring.running[job[0]] += 1
        elif job is None:
            self.unmatched += 1
        else:  # done: from waiting too, where the scheduler cancelled it
            self._drop(ring, e.fence)

    def _drop(self, ring: _Ring, fence: int) -> None:
        cgroup, running = ring.jobs.pop(fence)
        counts = ring.running if running else ring.waiting
        counts[cgroup] -= 1
        if not counts[cgroup]:
            del counts[cgroup]

    def _accrue(self, ring: _Ring, to: int) -> None:
        """The wait of ring's waiting jobs from its frontier to `to`, split by the rule."""
        if ring.frontier is not None and to > ring.frontier:
            dt = to - ring.frontier
            for waiter, w in ring.waiting.items():
                if not ring.running:
                    self._idle[(ring.addr, waiter)] += w * dt
                    continue
                for behind, part in split(w * dt, ring.running):
                    self._behind[(ring.addr, waiter, self._pair(ring, waiter, behind))] += part
        ring.frontier = to if ring.frontier is None else max(ring.frontier, to)

    def _pair(self, ring: _Ring, waiter: int, behind: int) -> int:
        """`behind`, or OTHER past the ring's cap of pairs."""
        pair = (waiter, behind)
        if pair in ring.pairs:
            return behind
        if len(ring.pairs) < self._max_pairs:
            ring.pairs.add(pair)
            return behind
        if pair not in ring.refused:
            ring.refused.add(pair)
            self.capped += 1
        return OTHER
