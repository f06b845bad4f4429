"""The agent's own aggregated counts (the metric catalogue is kubenpu.metrics.catalogue).

Why not OTel instruments: the agent counts per event from its own loop, where Counter.add costs
~10 µs. And the OTel Python SDK keeps an aggregation object for every attribute set an observable
instrument ever reported (≈1 KiB each, never freed), and after 2000 of them folds every NEW set
into its own overflow point, so a node with pod churn would export new pods as overflow within
hours. So this module owns the state, retires series itself, and hands plain snapshots to
kubenpu.export, which renders them for OTLP and for Prometheus.

Thread safety: one lock; event-loop calls hold it for a few dict operations, and `collect()`
(from the OTLP thread or a Prometheus scrape) holds it while copying the counts.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from kubenpu.descriptors import WHERE
from kubenpu.fdinfo import Skip
from kubenpu.kernel.abi import ERRORS, JOB_LOST_REASONS
from kubenpu.kernel.records import Durations, JobTimes, Key
from kubenpu.metrics.catalogue import (
    ALLOCATED,
    ALLOCATED_IDLE,
    ALLOCATED_IDLE_FOR,
    ALLOCATIONS_UNMAPPED,
    COUNTERS_READ,
    CRI_BOUNDS,
    CRI_DURATION,
    CRI_ERRORS,
    DESCRIPTORS_EXHAUSTED,
    DEVICE_COREDUMPS,
    DEVICE_INFO,
    DEVICE_RESETS,
    DROP_REASONS,
    DROPPED,
    ENGINE_CAPACITY,
    ENGINE_COUNTERS,
    EXPORT_ERRORS,
    FDINFO_SKIPPED,
    INDEX_REBUILDS,
    IOCTL,
    IOCTL_DURATION,
    IOCTL_ERRORS,
    IOCTL_SERIES,
    JOB_RUN,
    JOB_WAIT,
    JOBS,
    JOBS_IN_FLIGHT,
    JOBS_LOST,
    LATE_SIGHTINGS,
    MEMORY,
    OVERFLOW_ATTRS,
    OVERFLOW_CALLS,
    OVERFLOW_SERIES,
    PENDING_EXPIRED,
    POD_ENERGY,
    POD_HANGS,
    PODRESOURCES_ERRORS,
    READ_ERRORS,
    RECEIVED,
    RESET_VICTIMS,
    SERIES_SOURCES,
    SKIP_REASONS,
    TELEMETRY_SKIPPED,
    TELEMETRY_SPECS,
    TLS_EXPIRY,
    UEVENT_SKIPS,
    UEVENTS_SKIPPED,
    UNALLOCATED_CALLS,
    UNATTRIBUTED,
    UNATTRIBUTED_REASONS,
    UNTIMED,
    Attrs,
    Spec,
)
from kubenpu.metrics.inputs import AllocationState, DeviceRow, Where


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


# (container, device, vendor, engine) -> value, per engine counter Spec
_EngineKey = tuple[str, str, str, str]
# What retires as one: (namespace, pod, pod uid, "") for a pod (two pods of one name, one after
# the other, are two units); (namespace, "", "", container) for a container without pod labels
# (started with ctr or nerdctl), whose name is its only identity.
_Unit = tuple[str, str, str, str]


def _summed(timed: list[Durations]) -> ExpHist:
    """One series' histogram: its keys' (cgroups') durations summed slot by slot."""
    slots = tuple(map(sum, zip(*(x.slots for x in timed), strict=True)))
    return ExpHist(slots, sum(x.sum_ns for x in timed) / 1e9)


def _finite(value: float) -> bool:
    """Whether value is a finite double, as Prometheus and OTLP's as_double carry it."""
    try:
        return math.isfinite(value)  # an int past ~1.8e308 raises: no double holds it
    except OverflowError:
        return False


def _series(state: AllocationState) -> int:
    return sum(
        map(len, (state.shares, state.idle, state.idle_for, state.unallocated, state.unmapped))
    )


def _capped(state: AllocationState, room: int) -> tuple[AllocationState, int]:
    """`state` in at most `room` series, and how many it left out: the unmapped counts (a few,
    by resource and reason) first, then each Held's series together, in the order held, then
    the unallocated calls."""
    kept, dropped = AllocationState(), 0

    def take(cost: int) -> bool:
        nonlocal room, dropped
        if cost > room:
            dropped += cost
            return False
        room -= cost
        return True

    for key, n in state.unmapped.items():
        if take(1):
            kept.unmapped[key] = n
    parts = ((state.shares, kept.shares), (state.idle, kept.idle), (state.idle_for, kept.idle_for))
    for held in dict.fromkeys([*state.shares, *state.idle, *state.idle_for]):
        present = [(src, dst) for src, dst in parts if held in src]
        if take(len(present)):
            for src, dst in present:
                dst[held] = src[held]
    for user, calls in state.unallocated.items():
        if take(1):
            kept.unallocated[user] = calls
    return kept, dropped


def _unit(namespace: str, pod: str, container: str, pod_uid: str = "") -> _Unit:
    return (namespace, pod, pod_uid, "") if pod else (namespace, "", "", container)


@dataclass
class _Pod:
    start_ns: int
    live: set[str] = field(default_factory=set)
    series: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    # per series, the kernel's cumulative durations of each of its keys (cgroups)
    timed: dict[tuple[str, str, str, str], dict[Key, Durations]] = field(default_factory=dict)
    engines: dict[Spec, dict[_EngineKey, float]] = field(default_factory=dict)
    # per (container, device, vendor, ring), the kernel's cumulative GPU jobs of each cgroup
    jobs: dict[_EngineKey, dict[int, JobTimes]] = field(default_factory=dict)
    # per (container, device, vendor, POD_HANGS or RESET_VICTIMS' name), device resets
    resets: dict[_EngineKey, int] = field(default_factory=dict)


@dataclass
class _Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * (len(CRI_BOUNDS) + 1))
    count: int = 0
    total: float = 0.0
    low: float = float("inf")
    high: float = float("-inf")

    def record(self, v: float) -> None:
        self.buckets[next((i for i, b in enumerate(CRI_BOUNDS) if v <= b), len(CRI_BOUNDS))] += 1
        self.count += 1
        self.total += v
        self.low = min(self.low, v)
        self.high = max(self.high, v)


class Metrics:
    """Counts per (namespace, pod, pod uid, container, device, vendor, kind), plus self-metrics.

    Lifecycle: a container is live from its first call until `container_gone()`; when every
    container of a pod seen here is gone, the pod's series are exported for `series_ttl` more
    seconds (so the last increments reach the collector), then dropped and their memory freed.
    A container without pod labels retires alike, on its own. A call from a gone container
    revives it. Series with no container label (unattributed calls) never retire.
    """

    def __init__(
        self,
        node_name: str,
        series_ttl: float,
        max_series: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._node = node_name
        self._ttl = series_ttl
        self._max = max_series
        self._clock = clock
        self._start_ns = time.time_ns()
        self._lock = threading.Lock()
        self._pods: dict[_Unit, _Pod] = {}
        self._gone: dict[_Unit, float] = {}  # insertion order = order of going
        self._nseries = 0  # kubenpu_ioctl_total's; the allocations' and telemetry's beside
        self._timed_series = 0  # kubenpu_ioctl_duration_seconds' (its error series go with it)
        self._allocation_series = 0
        self._telemetry_series = 0
        self._job_series = 0
        self._jobs_lost = dict.fromkeys(JOB_LOST_REASONS, 0)
        self._overflow = 0
        self._overflow_series = dict.fromkeys(SERIES_SOURCES, 0)
        self._devices: list[DeviceRow] = []
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._unattributed = dict.fromkeys(UNATTRIBUTED_REASONS, 0)
        self._received = 0
        self._rebuilds = 0
        self._cri = _Histogram()
        self._cri_errors = 0
        self._export_errors = 0
        self._late_sightings = 0
        self._untimed = 0
        # A pod dropped since swept() was last asked: a value set_durations() stored stays
        # until then. A flag, not a count: a growing int would hold memory the churn test sees.
        self._swept = False
        self._read_errors = 0
        self._counters_read: dict[str, float] = {}
        self._pending_expired = 0
        self._skipped = dict.fromkeys(SKIP_REASONS, 0)
        self._exhausted = dict.fromkeys(WHERE, 0)
        self._resets: dict[tuple[str, str, str], int] = {}  # (device, vendor, method)
        self._coredumps: dict[tuple[str, str], int] = {}  # (device, vendor)
        self._uevents_skipped = dict.fromkeys(UEVENT_SKIPS, 0)
        self._certificates: dict[str, float] = {}
        self._capacity: dict[tuple[Where, str], int] = {}
        self._memory: dict[tuple[Where, str, str], int] = {}
        self._allocations = AllocationState()
        self._podresources_errors = 0
        self._telemetry: dict[str, list[tuple[Spec, Attrs, float]]] = {}  # device -> points
        self._telemetry_skipped: dict[str, int] = {}

    # --- called from the agent's event loop -------------------------------------------------

    def add_calls(
        self,
        namespace: str,
        pod: str,
        container: str,
        device: str,
        vendor: str,
        kind: str,
        n: int = 1,
        pod_uid: str = "",
    ) -> None:
        key = (container, device, vendor, kind)
        unit = _unit(namespace, pod, container, pod_uid)
        with self._lock:
            rec = self._pods.get(unit)
            if rec is None or key not in rec.series:
                if self._held() >= self._max:
                    self._sweep()  # expired series must not hold room until the next collect
                    rec = self._pods.get(unit)
                if self._held() >= self._max:
                    self._overflow += n
                    return
                if rec is None:
                    rec = self._pods[unit] = _Pod(time.time_ns())
                rec.series[key] = 0
                self._nseries += 1
            rec.series[key] += n
            self._live(rec, unit, container)

    def set_durations(self, where: Where, kind: str, key: Key, value: Durations) -> bool:
        """The kernel's cumulative durations and errors of one key (a cgroup's calls of one
        device and kind) of the series `where` + `kind`, whose calls add_calls() counted. A
        series whose calls are not counted (capped) is not timed either; a new histogram takes
        room under metrics.max_series as one series. True if stored: setting the same value
        again then changes nothing until swept() says a pod was dropped."""
        unit = _unit(where.namespace, where.pod, where.container, where.pod_uid)
        series = (where.container, where.device, where.vendor, kind)
        with self._lock:
            rec = self._pods.get(unit)
            if rec is None or series not in rec.series:
                return False
            if series not in rec.timed:
                if self._held() >= self._max:
                    self._overflow_series["durations"] += 1
                    return False
                rec.timed[series] = {}
                self._timed_series += 1
            rec.timed[series][key] = value
            return True

    def set_jobs(self, where: Where, ring: str, cgroup_id: int, times: JobTimes) -> None:
        """The kernel's cumulative GPU jobs of one cgroup on one ring (kubenpu.jobs), in the
        series `where` + `ring`, which retires with the pod. A new series takes room under
        metrics.max_series as one."""
        unit = _unit(where.namespace, where.pod, where.container, where.pod_uid)
        key = (where.container, where.device, where.vendor, ring)
        with self._lock:
            rec = self._pods.get(unit)
            if rec is None or key not in rec.jobs:
                if self._held() >= self._max:
                    self._overflow_series["jobs"] += 1
                    return
                if rec is None:
                    rec = self._pods[unit] = _Pod(time.time_ns())
                rec.jobs[key] = {}
                self._job_series += 1
            rec.jobs[key][cgroup_id] = times
            self._live(rec, unit, where.container)

    def pod_reset(self, spec: Spec, where: Where) -> None:
        """One device reset the container hung (POD_HANGS) or lost work in (RESET_VICTIMS)."""
        unit = _unit(where.namespace, where.pod, where.container, where.pod_uid)
        key = (where.container, where.device, where.vendor, spec.name)
        with self._lock:
            rec = self._pods.get(unit)
            if rec is None:
                rec = self._pods[unit] = _Pod(time.time_ns())
            rec.resets[key] = rec.resets.get(key, 0) + 1

    def jobs_lost(self, lost: dict[str, int]) -> None:
        """The kernel side's job losses by reason, cumulative (JOB_LOST_REASONS)."""
        with self._lock:
            self._jobs_lost = dict(lost)

    def _held(self) -> int:
        """The series under metrics.max_series. Caller holds the lock."""
        held = self._nseries + self._timed_series + self._job_series
        return held + self._allocation_series + self._telemetry_series

    def _live(self, rec: _Pod, unit: _Unit, container: str) -> None:
        """The container counts (again): its unit is not retiring. Caller holds the lock."""
        if container and container not in rec.live:
            rec.live.add(container)
            self._gone.pop(unit, None)

    def add_engine(self, spec: Spec, where: Where, engine: str, amount: float) -> None:
        """An increment of one of ENGINE_COUNTERS (or POD_ENERGY). Its series retire with the
        pod's calls.
        One that would take the counter past what a double holds is skipped (out_of_range):
        a value no exporter can encode failed every push and scrape while the pod lived."""
        unit = _unit(where.namespace, where.pod, where.container, where.pod_uid)
        with self._lock:
            rec = self._pods.get(unit)
            key = (where.container, where.device, where.vendor, engine)
            total = (0 if rec is None else rec.engines.get(spec, {}).get(key, 0)) + amount
            if not _finite(total):
                self._skipped[Skip.OUT_OF_RANGE] += 1
                return
            if rec is None:
                rec = self._pods[unit] = _Pod(time.time_ns())
            rec.engines.setdefault(spec, {})[key] = total
            self._live(rec, unit, where.container)

    def set_usage_gauges(
        self, capacity: dict[tuple[Where, str], int], memory: dict[tuple[Where, str, str], int]
    ) -> None:
        """The engine capacities and memory of the clients read last: (where, engine) and
        (where, region, state). Replaces the previous read's: a closed client's memory is gone."""
        with self._lock:
            self._capacity = dict(capacity)
            self._memory = dict(memory)

    def fdinfo_skipped(self, reasons: dict[str, int]) -> None:
        with self._lock:
            for reason, n in reasons.items():
                self._skipped[reason] = self._skipped.get(reason, 0) + n

    def set_allocations(self, state: AllocationState) -> None:
        """Replaces the last refresh's allocations, within the room the cap leaves beside the
        other series: 50,000 pods' allocations were 150,000 series past it."""
        with self._lock:
            self._allocation_series = 0
            self._sweep()
            self._allocations, dropped = _capped(state, self._max - self._held())
            self._allocation_series = _series(self._allocations)
            self._overflow_series["allocations"] += dropped

    def podresources_error(self) -> None:
        with self._lock:
            self._podresources_errors += 1

    def add_energy(self, where: Where, microjoules: int) -> None:
        """A pod's share of its device's energy, in whole µJ (sums stay exact), kept with its
        engine counters (no engine): its series retire with the pod's calls."""
        self.add_engine(POD_ENERGY, where, "", microjoules)

    def set_telemetry(self, device: str, points: list[tuple[Spec, Attrs, float]]) -> None:
        """The device's telemetry of the last read (counters cumulative), replacing the last."""
        with self._lock:
            self._telemetry_series -= len(self._telemetry.pop(device, []))
            room = max(0, self._max - self._held())
            self._telemetry[device] = list(points[:room])
            self._telemetry_series += len(self._telemetry[device])
            self._overflow_series["telemetry"] += max(0, len(points) - room)

    def telemetry_skipped(self, reasons: dict[str, int]) -> None:
        with self._lock:
            for reason, n in reasons.items():
                self._telemetry_skipped[reason] = self._telemetry_skipped.get(reason, 0) + n

    def device_reset(self, device: str, vendor: str, method: str) -> None:
        """One DRM wedged uevent of the device (kubenpu.uevents)."""
        with self._lock:
            key = (device, vendor, method)
            self._resets[key] = self._resets.get(key, 0) + 1

    def device_coredump(self, device: str, vendor: str) -> None:
        with self._lock:
            self._coredumps[(device, vendor)] = self._coredumps.get((device, vendor), 0) + 1

    def uevent_skipped(self, reason: str) -> None:
        with self._lock:
            self._uevents_skipped[reason] += 1

    def descriptors_exhausted(self, where: str, n: int = 1) -> None:
        with self._lock:
            self._exhausted[where] = self._exhausted.get(where, 0) + n

    def set_certificates(self, not_after: dict[str, float]) -> None:
        """Each configured certificate file's earliest notAfter, by setting."""
        with self._lock:
            self._certificates = dict(not_after)

    def container_gone(self, namespace: str, pod: str, container: str, pod_uid: str = "") -> None:
        """The container's cgroup is gone. Unknown containers are ignored."""
        unit = _unit(namespace, pod, container, pod_uid)
        with self._lock:
            rec = self._pods.get(unit)
            if rec is None or container not in rec.live:
                return
            rec.live.discard(container)
            if not rec.live:
                self._gone[unit] = self._clock()
            self._sweep()

    def dropped(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self._dropped[reason] = self._dropped.get(reason, 0) + n

    def unattributed(self, reason: str, n: int = 1) -> None:
        """Calls also counted, with empty pod labels, through add_calls()."""
        with self._lock:
            self._unattributed[reason] = self._unattributed.get(reason, 0) + n

    def late_sightings(self, n: int) -> None:
        with self._lock:
            self._late_sightings += n

    def untimed(self, n: int) -> None:
        with self._lock:
            self._untimed += n

    def read_error(self) -> None:
        with self._lock:
            self._read_errors += 1

    def counters_read(self, source: str, at: float) -> None:
        """The counters of `source` (COUNTER_SOURCES) now hold what was read at `at` (Unix
        time): a reader rates them over the change of `at`."""
        with self._lock:
            self._counters_read[source] = at

    def pending_expired(self, n: int) -> None:
        """Calls also counted, with empty pod labels, through add_calls()."""
        with self._lock:
            self._pending_expired += n

    def events_received(self, n: int) -> None:
        with self._lock:
            self._received += n

    def index_rebuilt(self) -> None:
        with self._lock:
            self._rebuilds += 1

    def cri_request(self, seconds: float, ok: bool) -> None:
        with self._lock:
            self._cri.record(seconds)
            if not ok:
                self._cri_errors += 1

    def export_error(self) -> None:
        with self._lock:
            self._export_errors += 1

    def set_devices(self, rows: Iterable[DeviceRow]) -> None:
        rows = [DeviceRow(*r) for r in rows]
        with self._lock:
            self._devices = rows

    # --- read by the exporters --------------------------------------------------------------

    def swept(self) -> bool:
        """Whether a pod was dropped (with its stored durations) since the last call."""
        with self._lock:
            swept, self._swept = self._swept, False
            return swept

    def pods_held(self) -> int:
        with self._lock:
            return len(self._pods)

    def _sweep(self) -> None:
        """Drop the pods gone for at least the TTL. Caller holds the lock."""
        now = self._clock()
        while self._gone:
            key, since = next(iter(self._gone.items()))
            if now - since < self._ttl:
                break
            del self._gone[key]
            rec = self._pods.pop(key)
            self._swept = True
            self._nseries -= len(rec.series)
            self._timed_series -= len(rec.timed)
            self._job_series -= len(rec.jobs)

    def collect(self) -> list[tuple[Spec, list[Point]]]:
        """Retire expired series, then snapshot every metric (cumulative values)."""
        with self._lock:
            self._sweep()
            return [
                (IOCTL, self._ioctl_points()),
                (IOCTL_DURATION, self._duration_points()),
                (IOCTL_ERRORS, self._error_points()),
                *self._job_points(),
                *((s, self._reset_points(s)) for s in (POD_HANGS, RESET_VICTIMS)),
                (JOBS_LOST, self._by_reason(self._jobs_lost)),
                (
                    DEVICE_INFO,
                    [
                        Point({**r._asdict(), "node": self._node}, 1, self._start_ns)
                        for r in self._devices
                    ],
                ),
                (DROPPED, self._by_reason(self._dropped)),
                (INDEX_REBUILDS, [Point({}, self._rebuilds, self._start_ns)]),
                (RECEIVED, [Point({}, self._received, self._start_ns)]),
                (UNATTRIBUTED, self._by_reason(self._unattributed)),
                (CRI_DURATION, [Point({}, self._cri_snapshot(), self._start_ns)]),
                (CRI_ERRORS, [Point({}, self._cri_errors, self._start_ns)]),
                (EXPORT_ERRORS, [Point({}, self._export_errors, self._start_ns)]),
                (IOCTL_SERIES, [Point({}, self._nseries, self._start_ns)]),
                (OVERFLOW_CALLS, [Point({}, self._overflow, self._start_ns)]),
                (
                    OVERFLOW_SERIES,
                    [
                        Point({"source": k}, n, self._start_ns)
                        for k, n in self._overflow_series.items()
                    ],
                ),
                (LATE_SIGHTINGS, [Point({}, self._late_sightings, self._start_ns)]),
                (UNTIMED, [Point({}, self._untimed, self._start_ns)]),
                (READ_ERRORS, [Point({}, self._read_errors, self._start_ns)]),
                (
                    COUNTERS_READ,
                    [
                        Point({"source": k}, t, self._start_ns)
                        for k, t in self._counters_read.items()
                    ],
                ),
                (PENDING_EXPIRED, [Point({}, self._pending_expired, self._start_ns)]),
                *((spec, self._engine_points(spec)) for spec in ENGINE_COUNTERS),
                (ENGINE_CAPACITY, self._gauge_points(self._capacity, ("engine",))),
                (MEMORY, self._gauge_points(self._memory, ("region", "state"))),
                (FDINFO_SKIPPED, self._by_reason(self._skipped)),
                *self._allocation_points(),
                *((spec, self._telemetry_points(spec)) for spec in TELEMETRY_SPECS),
                (TELEMETRY_SKIPPED, self._by_reason(self._telemetry_skipped)),
                (POD_ENERGY, self._energy_points()),
                (
                    DEVICE_RESETS,
                    [
                        Point({"device": d, "vendor": v, "method": m}, n, self._start_ns)
                        for (d, v, m), n in self._resets.items()
                    ],
                ),
                (
                    DEVICE_COREDUMPS,
                    [
                        Point({"device": d, "vendor": v}, n, self._start_ns)
                        for (d, v), n in self._coredumps.items()
                    ],
                ),
                (UEVENTS_SKIPPED, self._by_reason(self._uevents_skipped)),
                (
                    DESCRIPTORS_EXHAUSTED,
                    [Point({"where": w}, n, self._start_ns) for w, n in self._exhausted.items()],
                ),
                (
                    TLS_EXPIRY,
                    [
                        Point({"setting": k}, t, self._start_ns)
                        for k, t in self._certificates.items()
                    ],
                ),
            ]

    def _allocation_points(self) -> list[tuple[Spec, list[Point]]]:
        a, start = self._allocations, self._start_ns
        users = ("namespace", "pod", "container", "device")
        return [
            (ALLOCATED, [Point(h._asdict(), n, start) for h, n in a.shares.items()]),
            (ALLOCATED_IDLE, [Point(h._asdict(), s, t) for h, (s, t) in a.idle.items()]),
            (ALLOCATED_IDLE_FOR, [Point(h._asdict(), s, start) for h, s in a.idle_for.items()]),
            (
                UNALLOCATED_CALLS,
                [
                    Point(dict(zip(users, u, strict=True)), n, t)
                    for u, (n, t) in a.unallocated.items()
                ],
            ),
            (
                ALLOCATIONS_UNMAPPED,
                [
                    Point({"resource": r, "reason": why}, n, start)
                    for (r, why), n in a.unmapped.items()
                ],
            ),
            (PODRESOURCES_ERRORS, [Point({}, self._podresources_errors, start)]),
        ]

    def _telemetry_points(self, spec: Spec) -> list[Point]:
        return [
            Point(attrs, value, self._start_ns)
            for points in self._telemetry.values()
            for s, attrs, value in points
            if s is spec
        ]

    def _energy_points(self) -> list[Point]:
        return [
            Point(Where(ns, pod, uid, c, d, v)._asdict(), uj / 1e6, rec.start_ns)
            for (ns, pod, uid, _), rec in self._pods.items()
            for (c, d, v, _), uj in rec.engines.get(POD_ENERGY, {}).items()
        ]

    def _engine_points(self, spec: Spec) -> list[Point]:
        return [
            Point(
                {**Where(ns, pod, uid, c, d, v)._asdict(), "engine": e},
                value,
                rec.start_ns,
            )
            for (ns, pod, uid, _), rec in self._pods.items()
            for (c, d, v, e), value in rec.engines.get(spec, {}).items()
        ]

    def _gauge_points(self, values: dict, names: tuple[str, ...]) -> list[Point]:
        return [
            Point({**key[0]._asdict(), **dict(zip(names, key[1:], strict=True))}, v, self._start_ns)
            for key, v in values.items()
        ]

    def _timed(self) -> Iterator[tuple[Attrs, int, list[Durations]]]:
        """Every timed series' attributes, start and its keys' durations. Caller holds the
        lock."""
        for (ns, pod, uid, _), rec in self._pods.items():
            for (c, d, v, k), keys in rec.timed.items():
                attrs = {**Where(ns, pod, uid, c, d, v)._asdict(), "kind": k}
                yield attrs, rec.start_ns, list(keys.values())

    def _duration_points(self) -> list[Point]:
        return [Point(attrs, _summed(timed), start) for attrs, start, timed in self._timed()]

    def _job_points(self) -> list[tuple[Spec, list[Point]]]:
        """The GPU job histograms, counts and jobs in flight. Caller holds the lock."""
        by_spec: dict[Spec, list[Point]] = {
            s: [] for s in (JOB_WAIT, JOB_RUN, JOBS, JOBS_IN_FLIGHT)
        }
        for (ns, pod, uid, _), rec in self._pods.items():
            for (c, d, v, ring), keys in rec.jobs.items():
                attrs = {**Where(ns, pod, uid, c, d, v)._asdict(), "ring": ring}
                times = list(keys.values())
                done = sum(t.done for t in times)
                by_spec[JOB_WAIT].append(
                    Point(attrs, _summed([t.wait for t in times]), rec.start_ns)
                )
                by_spec[JOB_RUN].append(Point(attrs, _summed([t.run for t in times]), rec.start_ns))
                by_spec[JOBS].append(Point(attrs, done, rec.start_ns))
                in_flight = sum(t.queued for t in times) - done
                by_spec[JOBS_IN_FLIGHT].append(Point(attrs, max(0, in_flight), rec.start_ns))
        return list(by_spec.items())

    def _reset_points(self, spec: Spec) -> list[Point]:
        return [
            Point(Where(ns, pod, uid, c, d, v)._asdict(), n, rec.start_ns)
            for (ns, pod, uid, _), rec in self._pods.items()
            for (c, d, v, name), n in rec.resets.items()
            if name == spec.name
        ]

    def _error_points(self) -> list[Point]:
        points = []
        for attrs, start, timed in self._timed():
            totals = map(sum, zip(*(x.errors for x in timed), strict=True))
            for name, n in zip(ERRORS, totals, strict=True):
                if n:
                    points.append(Point({**attrs, "error": name}, n, start))
        return points

    def _ioctl_points(self) -> list[Point]:
        points = [
            Point(
                {**Where(ns, pod, uid, c, d, v)._asdict(), "kind": k},
                n,
                rec.start_ns,
            )
            for (ns, pod, uid, _), rec in self._pods.items()
            for (c, d, v, k), n in rec.series.items()
        ]
        if self._overflow:
            points.append(Point(dict(OVERFLOW_ATTRS), self._overflow, self._start_ns))
        return points

    def _by_reason(self, counts: dict[str, int]) -> list[Point]:
        return [Point({"reason": r}, n, self._start_ns) for r, n in counts.items()]

    def _cri_snapshot(self) -> Hist:
        c = self._cri
        return Hist(c.count, c.total, tuple(c.buckets), c.low, c.high)
