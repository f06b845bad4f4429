"""The blocked-by accounting (kubenpu.sources.contention): conservation as a property, the
split against a per-nanosecond reference, and the edges (out of order, late, unmatched,
cancelled, in flight, the cap)."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction
from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubenpu.kernel.abi import JOB_EVENT
from kubenpu.kernel.records import job_step
from kubenpu.sources.contention import (
    DONE,
    OTHER,
    QUEUED,
    RUN,
    UNKNOWN,
    Contention,
    Event,
    split,
)

MARGIN = 1000


class Job(NamedTuple):
    ring: int
    cgroup: int
    queued: int
    run: int | None
    done: int | None

    def events(self, fence: int) -> list[Event]:
        found = [Event(QUEUED, self.queued, fence, self.ring, self.cgroup, 0)]
        if self.run is not None:
            found.append(Event(RUN, self.run, fence, self.ring))
        if self.done is not None:
            found.append(Event(DONE, self.done, fence, self.ring))
        return found

    def wait(self, horizon: int) -> int:
        end = self.run if self.run is not None else self.done
        return (horizon if end is None else end) - self.queued


@st.composite
def jobs(draw: st.DrawFn, rings: int = 2, cgroups: int = 4, span: int = 60) -> list[Job]:
    found = []
    for _ in range(draw(st.integers(0, 8))):
        queued = draw(st.integers(0, span))
        run = draw(st.none() | st.integers(queued, span))
        done = draw(st.none() | st.integers(run if run is not None else queued, span))
        found.append(
            Job(draw(st.integers(1, rings)), draw(st.integers(1, cgroups)), queued, run, done)
        )
    return found


def events_of(found: list[Job]) -> list[Event]:
    return [e for fence, job in enumerate(found, 1) for e in job.events(fence)]


def replayed(found: list[Job], horizon: int, max_pairs: int = 16) -> Contention:
    c = Contention(max_pairs, MARGIN)
    c.add(events_of(found))
    c.advance(horizon + MARGIN)
    return c


def accrued(c: Contention) -> Counter[tuple[int, int]]:
    """Behind plus idle ns per (ring, waiter)."""
    totals = c.take()
    got: Counter[tuple[int, int]] = Counter()
    for (ring, waiter, _), ns in totals.behind.items():
        got[(ring, waiter)] += ns
    for key, ns in totals.idle.items():
        got[key] += ns
    return got


def conserved(found: list[Job], c: Contention, horizon: int) -> None:
    waits: Counter[tuple[int, int]] = Counter()
    for job in found:
        waits[(job.ring, job.cgroup)] += job.wait(horizon)
    assert +accrued(c) == +waits


@settings(deadline=None, max_examples=300)
@given(jobs())
def test_conservation(found: list[Job]) -> None:
    """Per (cgroup, ring): behind + idle == the sum of its jobs' waits, to the nanosecond."""
    horizon = 70
    conserved(found, replayed(found, horizon), horizon)


def reference(found: list[Job], horizon: int) -> dict[tuple[int, int, int], Fraction]:
    """Per nanosecond: each waiting job's nanosecond over the running jobs, exactly."""
    got: dict[tuple[int, int, int], Fraction] = {}
    for t in range(horizon):
        for ring in {j.ring for j in found}:
            on = [j for j in found if j.ring == ring]
            waiting = Counter(j.cgroup for j in on if j.queued <= t < j.queued + j.wait(horizon))
            running = Counter(
                j.cgroup
                for j in on
                if j.run is not None and j.run <= t < (horizon if j.done is None else j.done)
            )
            jobs_running = sum(running.values())
            for waiter, w in waiting.items():
                for behind, n in running.items():
                    key = (ring, waiter, behind)
                    got[key] = got.get(key, Fraction(0)) + Fraction(w * n, jobs_running)
    return got


@settings(deadline=None, max_examples=150)
@given(jobs(span=30))
def test_split_against_per_nanosecond_reference(found: list[Job]) -> None:
    """Each pair's integer ns is within one ns an interval of the exact share."""
    horizon = 32
    c = replayed(found, horizon)
    got, want = c.take().behind, reference(found, horizon)
    intervals = len(events_of(found)) + 1
    for key in set(got) | set(want):
        assert abs(got.get(key, 0) - want.get(key, Fraction(0))) < intervals, key
        if key not in want:
            raise AssertionError(f"{key} accrued with no reference share")


@settings(deadline=None, max_examples=150)
@given(jobs(), st.randoms(use_true_random=False), st.integers(1, 5))
def test_out_of_order_within_the_margin(found: list[Job], rnd, reads: int) -> None:
    """Records arriving shuffled (each at most the margin after its time), read in several
    reads, replay to what one sorted read gives, with none late."""
    horizon = 70
    evs = events_of(found)
    arrival = sorted(evs, key=lambda e: e.ts_ns + rnd.randrange(MARGIN))
    c = Contention(16, MARGIN)
    cuts = sorted(rnd.randrange(len(arrival) + 1) for _ in range(reads))
    start = 0
    for cut in [*cuts, len(arrival)]:
        batch = arrival[start:cut]
        c.add(batch)
        start = cut
        # a read at a time no record yet to come is older than by more than the margin
        upcoming = [e.ts_ns for e in arrival[cut:]]
        c.advance(min([*upcoming, horizon]) + MARGIN // 2 if upcoming else horizon + MARGIN)
    assert c.late == 0
    one = replayed(found, horizon)
    assert c.take() == one.take()


def at_once(events: list[Event], to: int) -> Contention:
    """`events` replayed with no margin, and every ring accrued up to `to`."""
    c = Contention(16, 0)
    c.add(events)
    c.advance(to)
    return c


def test_split_sums_exactly() -> None:
    parts = dict(split(10, Counter({7: 1, 3: 2})))
    assert parts == {3: 6, 7: 4}
    assert sum(dict(split(1, Counter({1: 1, 2: 1, 3: 1}))).values()) == 1


@pytest.mark.parametrize(
    ("found", "to", "want"),
    [
        pytest.param(
            [Job(9, 100, 0, 0, 50), Job(9, 200, 10, 60, 70)],
            100,
            ({(9, 200, 100): 40}, {(9, 200): 10}),
            id="B behind A's run 40 ns, then 10 ns on an idle ring (A done, B not run)",
        ),
        pytest.param(
            [Job(9, 5, 0, 0, 7), Job(9, 5, 0, 7, None)],
            20,
            ({(9, 5, 5): 7}, {}),
            id="behind its own job, run as that one is done",
        ),
    ],
)
def test_waits_behind_runs_and_on_an_idle_ring(found: list[Job], to: int, want: tuple) -> None:
    assert at_once(events_of(found), to).take() == want


def test_late_record_replayed_at_the_frontier_and_counted() -> None:
    c = Contention(16, 10)
    c.add([Event(QUEUED, 0, 1, 9, cgroup_id=5), Event(RUN, 5, 2, 9)])
    c.advance(110)  # replayed to 100
    c.add([Event(QUEUED, 50, 3, 9, cgroup_id=6)])  # older than the frontier: late
    c.advance(210)
    assert c.late == 1
    assert c.unmatched == 1  # the run of fence 2, never seen queued
    behind = c.take().behind
    assert behind[(9, 5, UNKNOWN)] == 195  # fence 1 waited behind the unknown job from 5
    assert behind[(9, 6, UNKNOWN)] == 100  # fence 3, replayed at 100


def test_run_and_done_without_queued() -> None:
    """Jobs queued before the attach: a run makes an UNKNOWN job run, a done alone is only
    counted."""
    c = at_once(
        [
            Event(RUN, 0, 1, 9),
            Event(QUEUED, 2, 2, 9, cgroup_id=5),
            Event(DONE, 4, 3, 9),
            Event(DONE, 10, 1, 9),
        ],
        20,
    )
    assert c.unmatched == 2
    assert c.take() == ({(9, 5, UNKNOWN): 8}, {(9, 5): 10})


def test_cancelled_job_waits_until_its_done() -> None:
    c = at_once([Event(QUEUED, 0, 1, 9, cgroup_id=5), Event(DONE, 30, 1, 9)], 100)
    assert c.take() == ({}, {(9, 5): 30})
    assert c.in_flight() == 0


def test_in_flight_at_read_accrues_to_the_horizon() -> None:
    c = Contention(16, 10)
    c.add([Event(QUEUED, 0, 1, 9, cgroup_id=6), Event(RUN, 0, 2, 9), Event(QUEUED, 0, 2, 9, 5)])
    c.advance(60)
    assert c.take().behind == {(9, 6, 5): 50}
    assert c.in_flight() == 2
    c.advance(100)
    assert c.take().behind == {(9, 6, 5): 40}


def test_jobs_held_per_ring_are_bounded_the_oldest_dropped() -> None:
    """A job whose later records were lost is held no longer than max_jobs newer ones."""
    c = Contention(16, 0, max_jobs=2)
    c.add([Event(QUEUED, t, t, 9, cgroup_id=5) for t in range(3)])
    c.advance(10)
    assert (c.in_flight(), c.unmatched) == (2, 1)
    assert c.take().idle == {(9, 5): 1 * 1 + 2 * 1 + 2 * 8}  # 1 job, 2, then 2 (oldest dropped)


def test_cap_sends_pairs_past_it_to_other() -> None:
    """20 pods wait behind one: 4 pairs kept, the other 16 pods' time behind OTHER, each
    refused pair counted once, conservation kept."""
    c = Contention(4, 0)
    evs = [Event(QUEUED, 0, 1, 9, cgroup_id=1000), Event(RUN, 0, 1, 9)]
    evs += [Event(QUEUED, 0, 10 + p, 9, cgroup_id=p) for p in range(1, 21)]
    c.add(evs)
    c.advance(10)
    c.advance(20)
    behind = c.take().behind
    assert len({b for (_, _, b) in behind if b != OTHER}) == 1
    assert sum(1 for (_, _, b) in behind if b != OTHER) == 4
    assert sum(1 for (_, _, b) in behind if b == OTHER) == 16
    assert all(ns == 20 for ns in behind.values())
    assert c.capped == 16
    c.add([Event(DONE, 20, 11, 9), Event(DONE, 20, 12, 9)])  # pods 1 and 2 cancelled, gone
    c.forget([1, 2])  # their room goes to two waiters past the cap
    c.advance(30)
    behind = c.take().behind
    assert sum(1 for (_, _, b) in behind if b != OTHER) == 4
    assert {w for (_, w, b) in behind if b != OTHER} == {3, 4, 5, 6}


def test_decode() -> None:
    raw = JOB_EVENT.pack(QUEUED, 42, 5, 6, 7, 8, 9)
    assert job_step(raw) == Event(QUEUED, 5, 6, 7, 8, 9, 42)
