"""The series table: every value the agent exports, in rows a source declares (a Family), under
one lock, one cap (metrics.max_series) and one retirement. The table knows no source: each source
declares its families beside its code, and the registry hands the table all of them, in order.

Why not OTel instruments: the agent counts per event from its own loop, where Counter.add costs
~10 µs. And the OTel Python SDK keeps an aggregation object for every attribute set an observable
instrument ever reported (≈1 KiB each, never freed), and after 2000 of them folds every NEW set
into its own overflow point, so a node with pod churn would export new pods as overflow within
hours. So this module owns the state, retires series itself, and hands plain snapshots to
kubenpu.export, which renders them for OTLP and for Prometheus.

Two kinds of rows:
- a PodFamily's rows belong to a pod (or a container without pod labels) and retire with it:
  a container is live from its first value until `gone()`; when every container of a pod is gone,
  the pod's rows are exported for `series_ttl` more seconds (so the last increments reach the
  collector), then dropped and their memory freed. The calls (kubenpu_ioctl_total) are the
  table's own pod rows, updated by `add_calls` without any per-family dispatch: it runs per call.
- a NodeFamily's rows are the node's: device telemetry, allocations, and the agent's own counts.

The cap counts the calls' series and every capped family's rows. When it is full, a new call
series is counted in the overflow point, and a new row of a capped family is refused and counted
in kubenpu_overflow_series_total by its family. Node families take only the room the pod series
leave (allocations, telemetry: each family's `fit` keeps what fits, in its own priority); a
device's state (hw.status, the stale flag) is always kept, a few series past the cap if need be
(docs/metrics.md, "Cardinality cap").

Thread safety: one lock; sources hold it for a few dict operations, and `collect()` (from the OTLP
thread or a Prometheus scrape) holds it while copying the values: one consistent snapshot.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kubenpu.metrics.catalogue import (
    IOCTL,
    IOCTL_SERIES,
    OVERFLOW_ATTRS,
    OVERFLOW_CALLS,
    OVERFLOW_SERIES,
    REFUSED,
    SERIES_SOURCES,
    Attrs,
    Spec,
)
from kubenpu.metrics.inputs import Where
from kubenpu.metrics.points import Point, Snapshot

# A pod row's series: (container, device, vendor, the family's own key: kind, engine, ring...)
SeriesKey = tuple[str, str, str, str]
# What retires as one: (namespace, pod, pod uid, "") for a pod (two pods of one name, one after
# the other, are two units); (namespace, "", "", container) for a container without pod labels
# (started with ctr or nerdctl), whose name is its only identity.
_Unit = tuple[str, str, str, str]


class PodRow(NamedTuple):
    """One pod row as a family renders it: the pod's labels (Where's), when its pod was first
    seen, the family's own key and the value."""

    where: Attrs
    start_ns: int
    key: str
    value: Any


def replaced(old: object, new: object) -> object:
    """The default merge: the new value replaces the old."""
    return new


def added(old: float | None, amount: float) -> float | None:
    """A counter's merge: None (refused) where the sum is past what a double holds: a value no
    exporter can encode would fail every push and scrape while the series lived."""
    total = (old or 0) + amount
    try:
        return total if math.isfinite(total) else None
    except OverflowError:  # an int past ~1.8e308: no double holds it
        return None


# OTLP carries a histogram's count and bucket counts as uint64: one past it fails every push.
HIST_MAX = 2**64 - 1
# The sub-key of a keyed row under which its gone sub-keys' values are kept, folded into one.
RETIRED = "retired"


class _Keyed(dict[object, Any]):
    """A keyed row: a value per sub-key, and the observations they hold together (kept as they
    change, so a put costs one value's count, not the row's)."""

    observations = 0


def keyed(observations: Callable[[Any], int]) -> Callable[[_Keyed | None, tuple], _Keyed | None]:
    """A merge that keeps one value per sub-key (a cgroup of the series): (sub-key, value).
    None (refused, the row keeps its last values) where the row's histograms would hold more
    than HIST_MAX observations (`observations` of one value): the sum of a series' cgroups (a
    restarted container's two) can pass what one kernel counter holds."""

    def merge(old: _Keyed | None, item: tuple[object, object]) -> _Keyed | None:
        sub, value = item
        values = _Keyed() if old is None else old
        was = values.get(sub)
        total = (
            values.observations + observations(value) - (0 if was is None else observations(was))
        )
        if total > HIST_MAX:
            return None
        values[sub], values.observations = value, total
        return values

    return merge


@dataclass(frozen=True, eq=False)
class PodFamily:
    """Rows that belong to a pod and retire with it. `render` turns every pod's rows into the
    family's points; `merge(old or None, value)` is the stored value, None to refuse it."""

    name: str  # kubenpu_series_overflow_total's source, where capped
    render: Callable[[list[PodRow]], Snapshot]
    merge: Callable[[Any, Any], Any] = replaced
    capped: bool = False  # a new row takes room under metrics.max_series
    cost: int = 1  # the series a new row takes under the cap: its points over OTLP
    needs_calls: bool = False  # only beside the counted calls series of the same key
    live: bool = True  # a value makes its container live (again)
    # A keyed family's retire(): a gone sub-key's value added into the row's RETIRED one.
    fold: Callable[[Any, Any], Any] | None = None


@dataclass(frozen=True, eq=False)
class NodeFamily:
    """The node's rows. `fit(value, room)` -> (what is kept, the series it costs, the series left
    out) makes the family capped; `initial` the rows exported before any value."""

    name: str
    render: Callable[[dict[Any, Any], int], Snapshot]
    merge: Callable[[Any, Any], Any] = replaced
    fit: Callable[[Any, int], tuple[Any, int, int]] | None = None
    initial: Callable[[], dict[Any, Any]] = dict


Family = PodFamily | NodeFamily


def counter(spec: Spec, name: str = "") -> NodeFamily:
    """A node counter without labels: set(family, "", n) adds n."""
    return NodeFamily(
        name or spec.name,
        lambda rows, start: [(spec, [Point({}, rows[""], start)])],
        added,
        initial=lambda: {"": 0},
    )


def by_label(spec: Spec, values: Iterable[str] = (), label: str = "reason") -> NodeFamily:
    """A node counter by one label (a reason): set(family, value, n) adds n; `values` are
    exported as 0 before any count."""
    known = tuple(values)
    return NodeFamily(
        spec.name,
        lambda rows, start: [(spec, [Point({label: k}, n, start) for k, n in rows.items()])],
        added,
        initial=lambda: dict.fromkeys(known, 0),
    )


def by_labels(spec: Spec) -> NodeFamily:
    """A node counter per label set: set(family, the spec's labels' values in order, n)."""

    def render(rows: dict[tuple[str, ...], int], start: int) -> Snapshot:
        return [
            (
                spec,
                [Point(dict(zip(spec.labels, k, strict=True)), n, start) for k, n in rows.items()],
            )
        ]

    return NodeFamily(spec.name, render, added)


@dataclass
class _Pod:
    start_ns: int
    live: set[str] = field(default_factory=set)
    series: dict[SeriesKey, int] = field(default_factory=dict)  # the calls
    rows: dict[PodFamily, dict[SeriesKey, Any]] = field(default_factory=dict)


def _unit(where: Where) -> _Unit:
    if where.pod:
        return (where.namespace, where.pod, where.pod_uid, "")
    return (where.namespace, "", "", where.container)


class Series:
    """The table. Eight operations: add_calls (per call), put (a pod row), set (a node row),
    retire (a keyed row's gone cgroup), gone (a container), swept, pods_held and collect."""

    def __init__(
        self,
        families: Sequence[Family],
        series_ttl: float,
        max_series: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._families = tuple(families)
        self._ttl = series_ttl
        self._max = max_series
        self._clock = clock
        self._start_ns = time.time_ns()
        self._lock = threading.Lock()
        self._pods: dict[_Unit, _Pod] = {}
        self._gone: dict[_Unit, float] = {}  # insertion order = order of going
        self._calls = 0  # the calls' series
        self._overflow = 0  # calls not counted in a series: the cap was full
        self._held: dict[str, int] = {f.name: 0 for f in self._families if _capped(f)}
        self._overflow_series = dict.fromkeys(SERIES_SOURCES, 0)
        # Values a capped pod family's merge refused: no exporter could encode the result.
        self._refused = {f.name: 0 for f in self._families if isinstance(f, PodFamily) and f.capped}
        self._node = {f: f.initial() for f in self._families if isinstance(f, NodeFamily)}
        self._cost: dict[tuple[NodeFamily, object], int] = {}  # a capped node row's series
        # A pod dropped since swept() was last asked: a value a source skips setting again
        # because it is stored is gone. A flag, not a count: a growing int would hold memory.
        self._swept = False

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
        unit = (namespace, pod, pod_uid, "") if pod else (namespace, "", "", container)
        with self._lock:
            rec = self._pods.get(unit)
            if rec is None or key not in rec.series:
                if self._full():
                    self._sweep()  # expired series must not hold room until the next collect
                    rec = self._pods.get(unit)
                if self._full():
                    self._overflow += n
                    return
                if rec is None:
                    rec = self._pods[unit] = _Pod(time.time_ns())
                rec.series[key] = 0
                self._calls += 1
            rec.series[key] += n
            self._live(rec, unit, container)

    def put(self, family: PodFamily, where: Where, key: str, value: object) -> bool:
        """Merge `value` into the pod row `where` + `key` of `family`; False if refused: the
        family's merge refused it, its calls are not counted (needs_calls), or the cap is full
        for a new row of a capped family."""
        unit = _unit(where)
        series = (where.container, where.device, where.vendor, key)
        with self._lock:
            rec = self._pods.get(unit)
            if family.needs_calls and (rec is None or series not in rec.series):
                return False
            rows = None if rec is None else rec.rows.get(family)
            new = rows is None or series not in rows
            if new and family.capped and self._total() + family.cost > self._max:
                self._overflow_series[family.name] += 1
                return False
            merged = family.merge(None if new else rows[series], value)  # type: ignore[index]
            if merged is None:
                if family.capped:
                    self._refused[family.name] += 1
                return False
            if rec is None:
                rec = self._pods[unit] = _Pod(time.time_ns())
                # No container of it is live, so gone() never comes: it retires after the TTL
                # unless one shows life (the unattributed unit never retires).
                if not family.live and any(unit):
                    self._gone[unit] = self._clock()
            if new and family.capped:
                self._held[family.name] += family.cost
            rec.rows.setdefault(family, {})[series] = merged
            if family.live:
                self._live(rec, unit, where.container)
            return True

    def set(self, family: NodeFamily, key: object, value: object) -> None:
        """Merge `value` into the node row `key` of `family`; a capped family's row replaces
        the last within the room the other series leave."""
        with self._lock:
            rows = self._node[family]
            if family.fit is None:
                rows[key] = family.merge(rows.get(key), value)
                return
            self._sweep()
            self._held[family.name] -= self._cost.pop((family, key), 0)
            kept, cost, dropped = family.fit(value, max(0, self._max - self._total()))
            rows[key] = kept
            self._cost[(family, key)] = cost
            self._held[family.name] += cost
            self._overflow_series[family.name] += dropped

    def retire(self, family: PodFamily, where: Where, key: str, sub: object) -> None:
        """The sub-key `sub` (a cgroup) of a keyed row is gone for good: its last value is
        folded into the row's RETIRED one (family.fold), so a unit that outlives its cgroups
        (the unattributed calls, a pod whose containers restart) holds one value per live
        cgroup, not one per cgroup it ever had, and its totals stay."""
        assert family.fold is not None
        with self._lock:
            rec = self._pods.get(_unit(where))
            rows = {} if rec is None else rec.rows.get(family, {})
            values = rows.get((where.container, where.device, where.vendor, key))
            if values is not None and sub in values:
                values[RETIRED] = family.fold(values.get(RETIRED), values.pop(sub))

    def gone(self, where: Where) -> None:
        """The container's cgroup is gone. Unknown containers are ignored."""
        unit = _unit(where)
        with self._lock:
            rec = self._pods.get(unit)
            if rec is None or where.container not in rec.live:
                return
            rec.live.discard(where.container)
            if not rec.live:
                self._gone[unit] = self._clock()
            self._sweep()

    def swept(self) -> bool:
        """Whether a pod was dropped (with its stored rows) since the last call."""
        with self._lock:
            swept, self._swept = self._swept, False
            return swept

    def pods_held(self) -> int:
        with self._lock:
            return len(self._pods)

    def collect(self) -> Snapshot:
        """Retire expired series, then snapshot every family (cumulative values)."""
        with self._lock:
            self._sweep()
            snapshot: Snapshot = [(IOCTL, self._call_points())]
            for family in self._families:
                if isinstance(family, PodFamily):
                    snapshot += family.render(self._pod_rows(family))
                else:
                    snapshot += family.render(self._node[family], self._start_ns)
            return snapshot + self._own_points()

    # --- caller holds the lock -------------------------------------------------------------

    def _total(self) -> int:
        """The series under metrics.max_series."""
        return self._calls + sum(self._held.values())

    def _full(self) -> bool:
        return self._total() >= self._max

    def _live(self, rec: _Pod, unit: _Unit, container: str) -> None:
        """The container counts (again): its unit is not retiring."""
        if container and container not in rec.live:
            rec.live.add(container)
            self._gone.pop(unit, None)

    def _sweep(self) -> None:
        """Drop the pods gone for at least the TTL."""
        now = self._clock()
        while self._gone:
            unit, since = next(iter(self._gone.items()))
            if now - since < self._ttl:
                break
            del self._gone[unit]
            rec = self._pods.pop(unit)
            self._swept = True
            self._calls -= len(rec.series)
            for family, rows in rec.rows.items():
                if family.capped:
                    self._held[family.name] -= len(rows) * family.cost

    def _pod_rows(self, family: PodFamily) -> list[PodRow]:
        return [
            PodRow(Where(ns, pod, uid, c, d, v)._asdict(), rec.start_ns, k, value)
            for (ns, pod, uid, _), rec in self._pods.items()
            for (c, d, v, k), value in rec.rows.get(family, {}).items()
        ]

    def _call_points(self) -> list[Point]:
        points = [
            Point({**Where(ns, pod, uid, c, d, v)._asdict(), "kind": k}, n, rec.start_ns)
            for (ns, pod, uid, _), rec in self._pods.items()
            for (c, d, v, k), n in rec.series.items()
        ]
        if self._overflow:
            points.append(Point(dict(OVERFLOW_ATTRS), self._overflow, self._start_ns))
        return points

    def _own_points(self) -> Snapshot:
        start = self._start_ns
        return [
            (IOCTL_SERIES, [Point({}, self._calls, start)]),
            (OVERFLOW_CALLS, [Point({}, self._overflow, start)]),
            (
                OVERFLOW_SERIES,
                [Point({"source": k}, n, start) for k, n in self._overflow_series.items()],
            ),
            (REFUSED, [Point({"source": k}, n, start) for k, n in self._refused.items()]),
        ]


def _capped(family: Family) -> bool:
    return family.capped if isinstance(family, PodFamily) else family.fit is not None
