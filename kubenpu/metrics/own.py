"""The agent's own families, written by no signal source: the devices it counts, the resolver's
lookups, the exporters' errors and certificates, the kernel reads and every source's read stamp."""

from __future__ import annotations

from dataclasses import dataclass, field

from kubenpu.descriptors import WHERE
from kubenpu.metrics.catalogue import (
    COUNTERS_READ,
    CRI_BOUNDS,
    CRI_DURATION,
    CRI_ERRORS,
    DESCRIPTORS_EXHAUSTED,
    DEVICE_INFO,
    EXPORT_ERRORS,
    INDEX_REBUILDS,
    PROBE_PINNED,
    READ_ERRORS,
    SOURCE_ERRORS,
    SOURCE_READ_DURATION,
    TLS_EXPIRY,
)
from kubenpu.metrics.inputs import DeviceRow
from kubenpu.metrics.points import Hist, Point
from kubenpu.metrics.series import NodeFamily, by_label, counter


@dataclass
class _Cri:
    """The CRI lookups' latency histogram (CRI_BOUNDS) and their errors."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(CRI_BOUNDS) + 1))
    count: int = 0
    total: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")
    errors: int = 0

    def record(self, seconds: float, ok: bool) -> _Cri:
        i = next((i for i, b in enumerate(CRI_BOUNDS) if seconds <= b), len(CRI_BOUNDS))
        self.buckets[i] += 1
        self.count += 1
        self.total += seconds
        self.low = min(self.low, seconds)
        self.high = max(self.high, seconds)
        self.errors += not ok
        return self

    def hist(self) -> Hist:
        return Hist(self.count, self.total, tuple(self.buckets), self.low, self.high)


# set(DEVICES, node name, rows): the devices counted, replacing the last list.
DEVICES = NodeFamily(
    DEVICE_INFO.name,
    lambda rows, start: [
        (
            DEVICE_INFO,
            [
                Point({**DeviceRow(*r)._asdict(), "node": node}, 1, start)
                for node, devices in rows.items()
                for r in devices
            ],
        )
    ],
)
INDEX_REBUILT = counter(INDEX_REBUILDS)
# set(CRI, "", (seconds, ok)): one CRI request.
CRI = NodeFamily(
    "cri",
    lambda rows, start: [
        (CRI_DURATION, [Point({}, rows[""].hist(), start)]),
        (CRI_ERRORS, [Point({}, rows[""].errors, start)]),
    ],
    lambda old, request: old.record(*request),
    initial=lambda: {"": _Cri()},
)
EXPORT_FAILED = counter(EXPORT_ERRORS)
# set(PINNED, "", 0 or 1): whether the probe outlives the agent, once attached.
PINNED = NodeFamily(
    PROBE_PINNED.name,
    lambda rows, start: [(PROBE_PINNED, [Point({}, rows[""], start)])],
    initial=lambda: {"": 0},
)
KERNEL_READ_FAILED = counter(READ_ERRORS)
# set(STAMPS, source, at): the counters of `source` now hold what was read at `at` (Unix time):
# a reader rates them over the change of `at`.
STAMPS = NodeFamily(
    COUNTERS_READ.name,
    lambda rows, start: [
        (COUNTERS_READ, [Point({"source": k}, t, start) for k, t in rows.items()])
    ],
)
# set(SOURCE_DURATION, source, seconds) and set(SOURCE_ERRORS, source, 1): kubenpu.sources.Report's.
SOURCE_DURATION = NodeFamily(
    SOURCE_READ_DURATION.name,
    lambda rows, start: [
        (SOURCE_READ_DURATION, [Point({"source": k}, s, start) for k, s in rows.items()])
    ],
)
SOURCE_FAILED = by_label(SOURCE_ERRORS, label="source")
EXHAUSTED = by_label(DESCRIPTORS_EXHAUSTED, WHERE, label="where")
# set(CERTIFICATES, "", {setting: notAfter}): each configured certificate file's earliest.
CERTIFICATES = NodeFamily(
    TLS_EXPIRY.name,
    lambda rows, start: [
        (TLS_EXPIRY, [Point({"setting": k}, t, start) for k, t in rows.get("", {}).items()])
    ],
)
FAMILIES = (
    DEVICES,
    INDEX_REBUILT,
    CRI,
    EXPORT_FAILED,
    PINNED,
    KERNEL_READ_FAILED,
    STAMPS,
    SOURCE_DURATION,
    SOURCE_FAILED,
    EXHAUSTED,
    CERTIFICATES,
)
