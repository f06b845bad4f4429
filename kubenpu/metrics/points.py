"""What a snapshot is made of: a Point (attributes, value, start) of a plain number, a Hist (the
CRI latency's fixed buckets) or an ExpHist (the kernel's exponential buckets)."""

from __future__ import annotations

from collections.abc import Iterable
from operator import add
from typing import NamedTuple

from kubenpu.kernel.records import Durations
from kubenpu.metrics.catalogue import Attrs, Spec


class Hist(NamedTuple):
    count: int
    total: float
    buckets: tuple[int, ...]  # per bucket, not cumulative; len(CRI_BOUNDS) + 1
    low: float
    high: float


class ExpHist(NamedTuple):
    """A histogram in the kernel's buckets (kernel/abi.py, docs/latency.md): an OpenTelemetry
    exponential histogram at scale abi.SCALE. `slots`: calls at most 2^-20 s, then bucket by
    bucket from index abi.FIRST_INDEX, then over 64 s; `total`: their sum in seconds. Summed
    slot by slot over the cgroups of one series."""

    slots: tuple[int, ...]
    total: float

    @property
    def count(self) -> int:
        return sum(self.slots)

    def __add__(self, other: object) -> ExpHist:  # not a tuple's concatenation
        assert isinstance(other, ExpHist)
        slots = tuple(a + b for a, b in zip(self.slots, other.slots, strict=True))
        return ExpHist(slots, self.total + other.total)


class Point(NamedTuple):
    attrs: Attrs
    value: float | Hist | ExpHist
    start_ns: int


# One snapshot: every family's points, in the registry's order.
Snapshot = list[tuple[Spec, list[Point]]]


def plus(a: Durations | None, b: Durations) -> Durations:
    """Two keys' durations as one: a gone cgroup's added into its series' retired ones."""
    if a is None:
        return b
    return Durations(
        a.sum_ns + b.sum_ns,
        tuple(map(add, a.slots, b.slots)),
        tuple(map(add, a.errors, b.errors)),
    )


def summed(timed: Iterable[Durations]) -> ExpHist:
    """One series' histogram: its keys' (cgroups') durations summed slot by slot."""
    timed = list(timed)
    slots = tuple(map(sum, zip(*(x.slots for x in timed), strict=True)))
    return ExpHist(slots, sum(x.sum_ns for x in timed) / 1e9)
