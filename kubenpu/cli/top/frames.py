"""kubenpuctl top's frames: one reading turned into rows per container and device, and their
sort orders."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from kubenpu.cli.top.sources import (
    ALLOCATED,
    BEHIND,
    BUCKETS,
    BUSY,
    DEVICE_INFO,
    DROPPED,
    ENERGY,
    ERRORS,
    HELD,
    HELD_AGE,
    IDLE_FOR,
    IDLE_WAIT,
    IOCTL,
    KINDS,
    MEMORY,
    OVERFLOW,
    POD_LABELS,
    QUEUE_BUCKETS,
    RUN_BUCKETS,
    TARGET_INFO,
    UNATTRIBUTED,
    Reading,
    Series,
)

# --- one frame: rows and header ----------------------------------------------------------


class RowKey(NamedTuple):
    node: str
    namespace: str
    pod: str
    container: str
    device: str
    vendor: str


# BEHIND's name for the wait on an idle ring (no pod is called that: pods are ns/pod) and for
# the pairs past the agent's per-ring cap (behind_pod="other", behind_namespace="").
IDLE = "idle"
OTHER = "other"
NO_POD = "(no pod)"


class Behind(NamedTuple):
    """Whose running jobs a row's GPU jobs waited behind most in the interval."""

    who: str  # namespace/pod (the row's own pod too), OTHER or IDLE
    share: float  # of the row's queue wait in the interval, 0..1


def pod_name(namespace: str, pod: str) -> str:
    """namespace/pod; the agent's OTHER (no namespace), or NO_POD for processes outside pods."""
    if namespace:
        return f"{namespace}/{pod}"
    return pod or NO_POD


def blocker(labels: dict[str, str]) -> str:
    """The pod a kubenpu_job_wait_behind_seconds_total series names, as BEHIND shows it."""
    return pod_name(labels.get("behind_namespace", ""), labels.get("behind_pod", ""))


@dataclass
class Row:
    key: RowKey
    rates: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))
    busy: dict[str, float] = field(default_factory=dict)  # engine -> % of one engine
    memory: dict[str, dict[str, float]] = field(default_factory=dict)  # region -> state -> B
    shares: float | None = None  # allocated by the kubelet; None: not allocated
    idle_for: float | None = None
    watts: float | None = None  # the pod's share of the device's power (energy per pod)
    errors: float = 0.0  # failed calls per second
    wait_p99: float | None = None  # s: the bound of the bucket holding the waits' 99th percentile
    queue_p99: float | None = None  # s: the same of its GPU jobs' queue waits
    run_p99: float | None = None  # s: and of their run times
    behind: Behind | None = None  # None: no queue wait in the interval

    @property
    def total(self) -> float:
        return sum(self.rates.values())

    @property
    def max_busy(self) -> float:
        return max(self.busy.values(), default=0.0)

    @property
    def mem(self) -> float:
        """Resident bytes over all regions (total where the driver prints no resident)."""
        return sum(st.get("resident", st.get("total", 0.0)) for st in self.memory.values())


@dataclass
class Frame:
    rows: list[Row]
    nodes: list[str]
    versions: list[str]
    devices: list[tuple[str, str, str]]  # (node, device, vendor)
    engines: list[str]  # busy columns; empty when the family is not exported
    has_memory: bool
    measuring: bool
    has_allocations: bool = False  # no rates yet (the first scrape)
    has_energy: bool = False  # no rates yet (the first scrape)
    has_durations: bool = False
    has_jobs: bool = False
    has_behind: bool = False
    calls: float = 0.0
    dropped: float = 0.0
    dropped_rate: float = 0.0
    unattributed: float = 0.0
    unattributed_rate: float = 0.0
    overflow: float = 0.0
    held: float = 0.0  # calls waiting for the CRI to name their pod
    held_age: float = 0.0  # s: how long the oldest of them have waited
    malformed: int = 0


def _key(s: Series, multi_node: bool) -> RowKey:
    node = (s.labels.get("node") or s.labels.get("instance", "")) if multi_node else ""
    return RowKey(node, *(s.labels.get(k, "") for k in POD_LABELS))


def build_frame(reading: Reading, multi_node: bool) -> Frame:
    rows: dict[RowKey, Row] = {}

    def row(s: Series) -> Row:
        key = _key(s, multi_node)
        return rows.setdefault(key, Row(key))

    by_name: dict[str, list[Series]] = defaultdict(list)
    for s in reading.latest:
        by_name[s.name].append(s)
    rated: dict[str, list[Series]] = defaultdict(list)
    for s in reading.rates or ():
        rated[s.name].append(s)
    # The overflow series has no pod, device nor kind: it is in the header, not a row.
    for s in by_name[IOCTL]:  # idle pods too: their counters exist but did not move
        if s.labels.get("kind") in KINDS:
            row(s)
    for s in rated[IOCTL]:
        if s.labels.get("kind") in KINDS:
            row(s).rates[s.labels["kind"]] += s.value
    for s in rated[BUSY]:
        busy = row(s).busy
        engine = s.labels.get("engine", "")
        busy[engine] = busy.get(engine, 0.0) + 100 * s.value
    for s in rated[ENERGY]:
        r = row(s)
        r.watts = (r.watts or 0.0) + s.value
    for s in rated[ERRORS]:
        row(s).errors += s.value
    for r, p99 in _p99s(rated[BUCKETS], row, lambda s: s.labels.get("kind") == "wait"):
        r.wait_p99 = p99
    for r, p99 in _p99s(rated[QUEUE_BUCKETS], row):
        r.queue_p99 = p99
    for r, p99 in _p99s(rated[RUN_BUCKETS], row):
        r.run_p99 = p99
    for r, behind in _behind(rated[BEHIND] + rated[IDLE_WAIT], row):
        r.behind = behind
    for s in by_name[MEMORY]:
        states = row(s).memory.setdefault(s.labels.get("region", ""), {})
        state = s.labels.get("state", "")
        states[state] = states.get(state, 0.0) + s.value
    _allocations(rows, by_name, multi_node)
    info = by_name[DEVICE_INFO]
    return Frame(
        rows=list(rows.values()),
        nodes=_distinct(
            [s.labels.get("node", "") for s in info]
            + [s.labels.get("k8s_node_name", "") for s in by_name[TARGET_INFO]]
        ),
        versions=_distinct([s.labels.get("service_version", "") for s in by_name[TARGET_INFO]]),
        devices=sorted(
            {tuple(s.labels.get(k, "") for k in ("node", "device", "vendor")) for s in info}
        ),
        engines=sorted({s.labels.get("engine", "") for s in by_name[BUSY]}),
        has_memory=bool(by_name[MEMORY]),
        has_allocations=bool(by_name[ALLOCATED]),
        has_energy=bool(by_name[ENERGY]),
        has_durations=bool(by_name[BUCKETS]),
        has_jobs=bool(by_name[QUEUE_BUCKETS]),
        has_behind=bool(by_name[BEHIND] or by_name[IDLE_WAIT]),
        measuring=reading.rates is None,
        calls=sum(s.value for s in rated[IOCTL]),
        dropped=_sum(by_name[DROPPED]),
        dropped_rate=_sum(rated[DROPPED]),
        unattributed=_sum(by_name[UNATTRIBUTED]),
        unattributed_rate=_sum(rated[UNATTRIBUTED]),
        overflow=_sum(by_name[OVERFLOW]),
        held=_sum(by_name[HELD]),
        held_age=max((s.value for s in by_name[HELD_AGE]), default=0.0),
        malformed=reading.malformed,
    )


def _allocations(
    rows: dict[RowKey, Row], by_name: dict[str, list[Series]], multi_node: bool
) -> None:
    """Shares and idle streaks onto the rows of the same container and device (allocation
    series carry no vendor); an allocation without calls gets a row of its own."""
    by_place = {k._replace(vendor=""): r for k, r in rows.items()}
    for s in by_name[ALLOCATED] + by_name[IDLE_FOR]:
        key = _key(s, multi_node)._replace(vendor="")
        r = by_place.get(key) or rows.setdefault(key, Row(key))
        by_place[key] = r
        if s.name == ALLOCATED:
            r.shares = (r.shares or 0.0) + s.value
        else:
            r.idle_for = max(r.idle_for or 0.0, s.value)


def _p99s(
    buckets: list[Series],
    row: Callable[[Series], Row],
    keep: Callable[[Series], bool] = lambda s: True,
) -> list[tuple[Row, float]]:
    """Each row's 99th percentile of the histogram series `keep` takes over the rates'
    interval: the smallest `le` whose rate holds 99 % of the +Inf rate (the bucket's upper
    bound; inf: over the last). A row with nothing in the interval has none."""
    by_row: dict[RowKey, tuple[Row, dict[float, float]]] = {}
    for s in buckets:
        if not keep(s) or "le" not in s.labels:
            continue
        r = row(s)
        rates = by_row.setdefault(r.key, (r, {}))[1]
        le = float(s.labels["le"])
        rates[le] = rates.get(le, 0.0) + s.value
    return [
        (r, min(le for le, n in rates.items() if n >= _P99_SHARE * total))
        for r, rates in by_row.values()
        if (total := rates.get(float("inf"), 0.0)) > 0
    ]


def _behind(waits: list[Series], row: Callable[[Series], Row]) -> list[tuple[Row, Behind]]:
    """Each row's largest part of its queue wait over the rates' interval (summed over its
    rings): behind one pod, behind the pods past the cap, or on an idle ring; its share of all
    the row's wait. A tie goes to the name first in order, so frames do not flicker."""
    by_row: dict[RowKey, tuple[Row, dict[str, float]]] = {}
    for s in waits:
        r = row(s)
        parts = by_row.setdefault(r.key, (r, {}))[1]
        who = blocker(s.labels) if s.name == BEHIND else IDLE
        parts[who] = parts.get(who, 0.0) + s.value
    found = []
    for r, parts in by_row.values():
        total = sum(parts.values())
        if total > 0:
            who = min(parts, key=lambda w: (-parts[w], w))
            found.append((r, Behind(who, parts[who] / total)))
    return found


# 99 %, less a little: the rates are counts divided by one interval, and 99/7 is less than
# 0.99 * (100/7) in floating point, so a bucket holding exactly 99 % would be passed over.
_P99_SHARE = 0.99 * (1 - 1e-9)


def _distinct(values: Iterable[str]) -> list[str]:
    return sorted({v for v in values if v})


def _sum(series: Iterable[Series]) -> float:
    return sum(s.value for s in series)


# --- sorting -----------------------------------------------------------------------------

# Sort name -> (key press, row value). Numbers sort highest first, names A to Z.
SORTS: dict[str, tuple[str, Callable[[Row], float | str]]] = {
    "total": ("t", lambda r: r.total),
    "submit": ("s", lambda r: r.rates["submit"]),
    "alloc": ("a", lambda r: r.rates["alloc"]),
    "wait": ("w", lambda r: r.rates["wait"]),
    "busy": ("b", lambda r: r.max_busy),
    "memory": ("m", lambda r: r.mem),
    "shares": ("h", lambda r: r.shares or 0.0),
    "idle": ("i", lambda r: r.idle_for or 0.0),
    "power": ("e", lambda r: r.watts or 0.0),
    "p99": ("l", lambda r: r.wait_p99 or 0.0),
    "queue": ("u", lambda r: r.queue_p99 or 0.0),
    "run": ("j", lambda r: r.run_p99 or 0.0),
    "errors": ("x", lambda r: r.errors),
    # The share of the row's wait behind one pod; a wait on an idle ring is in no pod's way.
    "behind": ("k", lambda r: r.behind.share if r.behind and r.behind.who != IDLE else 0.0),
    "node": ("o", lambda r: r.key.node),
    "namespace": ("n", lambda r: r.key.namespace),
    "pod": ("p", lambda r: r.key.pod),
    "container": ("c", lambda r: r.key.container),
    "device": ("d", lambda r: r.key.device),
    "vendor": ("v", lambda r: r.key.vendor),
}
SORT_KEYS = {key: name for name, (key, _) in SORTS.items()}
NUMERIC = (
    "total",
    "submit",
    "alloc",
    "wait",
    "busy",
    "memory",
    "shares",
    "idle",
    "power",
    "p99",
    "queue",
    "run",
    "errors",
    "behind",
)


def sort_rows(rows: list[Row], by: str, reverse: bool = False) -> list[Row]:
    value = SORTS[by][1]
    # Names then the row key break ties, so equal rows keep one stable order between frames.
    ordered = sorted(rows, key=lambda r: r.key)
    return sorted(ordered, key=value, reverse=(by in NUMERIC) != reverse)
