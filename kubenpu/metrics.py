"""The agent's own aggregated counts, and the description of every metric it exports.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from kubenpu.descriptors import WHERE
from kubenpu.events import Drop
from kubenpu.fdinfo import Skip
from kubenpu.resolve import Unattributed

Attrs = dict[str, str | bool]

OVERFLOW_ATTRS: Attrs = {"otel.metric.overflow": True}
DROP_REASONS = tuple(r.value for r in Drop)
UNATTRIBUTED_REASONS = tuple(r.value for r in Unattributed)
SKIP_REASONS = tuple(r.value for r in Skip)
_PROM_UNITS = {
    "s": "seconds",
    "By": "bytes",
    "W": "watts",
    "J": "joules",
    "Cel": "celsius",
    "Hz": "hertz",
    "V": "volts",
    "1": "ratio",
}
CRI_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Spec:
    """One metric. `name` and `unit` are OTel's; `prometheus_name` derives the Prometheus name
    exactly as Prometheus' own OTLP translation does."""

    name: str
    kind: Literal["counter", "gauge", "histogram"]
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    # The Prometheus name where it differs from the translation of `name` (semconv's hw.* names
    # become kubenpu_device_*: docs/metrics.md lists each).
    prometheus: str = ""

    @property
    def prometheus_name(self) -> str:
        """The name /metrics gives the metric: Prometheus' translation of `prometheus`, else of
        `name`."""
        return self._translated(self.prometheus or self.name)

    @property
    def translated_name(self) -> str:
        """The name Prometheus' own OTLP translation gives the pushed metric (dots to
        underscores, unit suffix, _total): prometheus_name unless `prometheus` is set."""
        return self._translated(self.name)

    def _translated(self, name: str) -> str:
        name = name.replace(".", "_")
        unit = "" if self.unit.startswith("{") else _PROM_UNITS.get(self.unit, self.unit)
        if unit and not name.endswith("_" + unit):
            name += "_" + unit
        return name + "_total" if self.kind == "counter" else name


IOCTL = Spec(
    "kubenpu.ioctl",
    "counter",
    "{call}",
    "Driver ioctl calls (submit, alloc, wait) made by processes, per container and device. "
    "Counts calls, not utilisation.",
    ("namespace", "pod", "container", "device", "vendor", "kind"),
)
DEVICE_INFO = Spec(
    "kubenpu.device.info",
    "gauge",
    "",
    "Always 1: one series per accelerator device the agent counts.",
    ("device", "vendor", "driver", "pci_id", "numa_node", "node"),
)
DROPPED = Spec(
    "kubenpu.events.dropped",
    "counter",
    "{call}",
    "Calls lost before being counted: ringbuf_full (events mode: the kernel ring buffer was "
    "full), map_full (aggregate mode: the kernel counts map had no room for a new key), "
    "queue_full (a batch already held probe.queue_size distinct keys), device_unknown (a call "
    "on a device the agent did not list), bad_record (a ring-buffer record that could not be "
    "decoded), handover (a call made while a new probe took over from a pinned one: counted once "
    "by the retiring probe or not at all).",
    ("reason",),
)
INDEX_REBUILDS = Spec(
    "kubenpu.cgroup_index.rebuilds",
    "counter",
    "{rebuild}",
    "Full rebuilds of the cgroup id to container index.",
)
RECEIVED = Spec(
    "kubenpu.events.received",
    "counter",
    "{event}",
    "Calls received from the kernel: one per ring-buffer event in events mode, the counts map's "
    "increments in aggregate mode.",
)
UNATTRIBUTED = Spec(
    "kubenpu.unattributed_calls",
    "counter",
    "{call}",
    "Calls counted in kubenpu_ioctl_total with empty namespace/pod/container, by reason: "
    "not_indexed (no cgroup found), not_pod (host process outside any pod), "
    "container_not_found (cgroup not known to the CRI), cri_error (CRI request failed), "
    "pending_full (held for a pod the CRI could not name yet, but the pending table was full), "
    "label_too_long (the CRI's labels break Kubernetes' length limits).",
    ("reason",),
)
CRI_DURATION = Spec(
    "kubenpu.cri.request.duration",
    "histogram",
    "s",
    "Duration of CRI requests made to attribute containers, successful or not.",
)
CRI_ERRORS = Spec(
    "kubenpu.cri.errors",
    "counter",
    "{request}",
    "CRI requests that failed or timed out.",
)
EXPORT_ERRORS = Spec(
    "kubenpu.otlp.export.errors",
    "counter",
    "{export}",
    "OTLP pushes that failed; counts are cumulative, so the next successful push loses nothing.",
)
IOCTL_SERIES = Spec(
    "kubenpu.ioctl.series",
    "gauge",
    "{series}",
    "kubenpu_ioctl_total series currently held (at most metrics.max_series, plus overflow).",
)
OVERFLOW_CALLS = Spec(
    "kubenpu.overflow_calls",
    "counter",
    "{call}",
    'Calls counted in the kubenpu_ioctl_total{otel_metric_overflow="true"} series because '
    "metrics.max_series was reached.",
)
LATE_SIGHTINGS = Spec(
    "kubenpu.sightings.late",
    "counter",
    "{sighting}",
    "New keys (aggregate mode) and new cgroups (births, both modes) the kernel ring buffer had "
    "no room to announce. No call is lost; the cgroup is resolved later, from a walk of the "
    "cgroup tree, instead of at once.",
)
READ_ERRORS = Spec(
    "kubenpu.probe.read.errors",
    "counter",
    "{read}",
    "Reads of the kernel's counters that failed; retried at the next read, which loses nothing.",
)
PENDING_EXPIRED = Spec(
    "kubenpu.pending.expired_calls",
    "counter",
    "{call}",
    "Calls held while the CRI could not name their pod, then counted with empty pod labels "
    "after attribution.pending_seconds.",
)
_POD = ("namespace", "pod", "container", "device", "vendor")
ENGINE_BUSY = Spec(
    "kubenpu.engine.busy",
    "counter",
    "s",
    "Device engine busy time of the pod's DRM clients, from drm-engine-<engine> in "
    "/proc/PID/fdinfo. Divide its rate by kubenpu_engine_capacity for a fraction of the engine "
    "class. Only drivers that print drm usage stats report it.",
    (*_POD, "engine"),
)
ENGINE_CYCLES = Spec(
    "kubenpu.engine.cycles",
    "counter",
    "{cycle}",
    "Engine busy cycles of the pod's DRM clients (drm-cycles-<engine>), for drivers that count "
    "cycles instead of time (xe).",
    (*_POD, "engine"),
)
ENGINE_TOTAL_CYCLES = Spec(
    "kubenpu.engine.cycles.elapsed",
    "counter",
    "{cycle}",
    "Engine cycles elapsed while the pod's DRM clients were read (drm-total-cycles-<engine>), "
    "summed over clients: busy fraction = rate(cycles) / rate(cycles.elapsed).",
    (*_POD, "engine"),
)
ENGINE_CAPACITY = Spec(
    "kubenpu.engine.capacity",
    "gauge",
    "{engine}",
    "Engines of one class a DRM client can use (drm-engine-capacity-<engine>; 1 when the driver "
    "prints none), the largest over the pod's clients.",
    (*_POD, "engine"),
)
MEMORY = Spec(
    "kubenpu.memory",
    "gauge",
    "By",
    "Device memory held by the pod's DRM clients at the last read, per region and state "
    "(total, shared, resident, active, purgeable; drm-memory-<region> counts as resident).",
    (*_POD, "region", "state"),
)
FDINFO_SKIPPED = Spec(
    "kubenpu.fdinfo.skipped",
    "counter",
    "{item}",
    "Processes, fds or lines found while reading fdinfo and not used, by reason: vanished (went "
    "away mid-read), unreadable (no ptrace-read access), no_descriptors (EMFILE/ENFILE: read "
    "again next time), malformed (a drm- line breaking the "
    "spec), out_of_range (a value past 2^63-1, which OTLP cannot carry, or an increment taking "
    "a counter past a double's range), no_client_id (a DRM fd "
    "whose driver prints no usage stats), unknown_device.",
    ("reason",),
)
ALLOCATED = Spec(
    "kubenpu.device.allocated",
    "gauge",
    "{share}",
    "Shares of the device the container was allocated, from the kubelet's PodResources API "
    "(device-plugin ids and DRA devices; docs/allocations.md).",
    ("namespace", "pod", "container", "device", "resource"),
)
ALLOCATED_IDLE = Spec(
    "kubenpu.device.allocated.idle",
    "counter",
    "s",
    "Time the container held the allocation with no submit-class call on the device and no "
    "engine busy time (or cycles) on it (docs/metrics.md, Idle allocations).",
    ("namespace", "pod", "container", "device", "resource"),
)
ALLOCATED_IDLE_FOR = Spec(
    "kubenpu.device.allocated.idle_for",
    "gauge",
    "s",
    "How long the allocation has been idle without a break, at the last refresh (0 while used).",
    ("namespace", "pod", "container", "device", "resource"),
)
UNALLOCATED_CALLS = Spec(
    "kubenpu.device.unallocated_calls",
    "counter",
    "{call}",
    "Submit-class calls a container made on a device that some allocation on the node names, "
    "while the container was allocated none of it (seen at each allocations refresh). The "
    "calls are counted in kubenpu_ioctl_total all the same.",
    ("namespace", "pod", "container", "device"),
)
ALLOCATIONS_UNMAPPED = Spec(
    "kubenpu.allocations.unmapped",
    "gauge",
    "{id}",
    "Allocated ids held now that map to no discovered device, by resource and reason: empty_id, "
    "unknown_format (no known id format and no PCI address or node name in it), no_device (it "
    "names a device discovery did not find), empty_pod (an entry without a pod or container "
    "name).",
    ("resource", "reason"),
)
PODRESOURCES_ERRORS = Spec(
    "kubenpu.podresources.errors",
    "counter",
    "{request}",
    "PodResources requests to the kubelet that failed or timed out; retried at the next refresh.",
)
# Device telemetry from sysfs and hwmon (kubenpu/telemetry.py): OTel hardware semantic
# conventions' names where they have one. Every point carries these, plus the kind's own labels.
_HW = ("device", "vendor", "hw.id", "hw.type", "hw.vendor")
POWER = Spec(
    "hw.power",
    "gauge",
    "W",
    "Device power now, per sensor: hwmon powerN_input or powerN_average; source=derived when "
    "the driver has only an energy counter (i915, xe): its increase over the last interval.",
    (*_HW, "sensor", "chip", "source"),
    "kubenpu.device.power",
)
POWER_LIMIT = Spec(
    "kubenpu.device.power.limit",
    "gauge",
    "W",
    "Device power limits, per sensor and limit (hwmon powerN_cap, _max, _crit, _rated_max; "
    "habanalabs max_power).",
    (*_HW, "sensor", "chip", "limit"),
)
ENERGY = Spec(
    "hw.energy",
    "counter",
    "J",
    "Device energy since the agent started: the driver's counter (hwmon energyN_input, "
    "source=driver; wraps and resets handled), else power integrated over time "
    "(source=integrated). The counter kubenpu_energy_joules_total splits.",
    (*_HW, "source"),
    "kubenpu.device.energy",
)
TEMPERATURE = Spec(
    "hw.temperature",
    "gauge",
    "Cel",
    "Device temperature per sensor (hwmon tempN_input; sensor is tempN_label where the driver "
    "names it: edge, junction, mem).",
    (*_HW, "sensor", "chip"),
    "kubenpu.device.temperature",
)
VOLTAGE = Spec(
    "hw.voltage",
    "gauge",
    "V",
    "Device voltage per sensor (hwmon inN_input).",
    (*_HW, "sensor", "chip"),
    "kubenpu.device.voltage",
)
FREQUENCY = Spec(
    "kubenpu.device.frequency",
    "gauge",
    "Hz",
    "Device clock per domain and state (actual, requested, max, min, rp0): hwmon freqN_input "
    "and the drivers' own frequency files (i915 gt, xe freq0, ivpu, habanalabs).",
    (*_HW, "domain", "state"),
)
THROTTLE = Spec(
    "kubenpu.device.throttle",
    "gauge",
    "",
    "1 while the driver reports the device throttled for reason (i915 throttle_reason_*, xe "
    "throttle/reason_*; status is any reason), else 0.",
    (*_HW, "domain", "reason"),
)
MEMORY_USED = Spec(
    "hw.gpu.memory.usage",
    "gauge",
    "By",
    "Device memory in use (amdgpu mem_info_vram_used, ivpu npu_memory_utilization).",
    (*_HW, "region"),
    "kubenpu.device.memory.used",
)
MEMORY_LIMIT = Spec(
    "hw.gpu.memory.limit",
    "gauge",
    "By",
    "Device memory size (amdgpu mem_info_vram_total).",
    (*_HW, "region"),
    "kubenpu.device.memory.limit",
)
UTILIZATION = Spec(
    "hw.gpu.utilization",
    "gauge",
    "1",
    "Device busy fraction as the driver reports it (amdgpu gpu_busy_percent, mem_busy_percent).",
    (*_HW, "task"),
    "kubenpu.device.utilization",
)
DEVICE_BUSY = Spec(
    "kubenpu.device.busy",
    "counter",
    "s",
    "Device busy time as the driver counts it (ivpu npu_busy_time_us), since it loaded.",
    _HW,
)
TELEMETRY_SKIPPED = Spec(
    "kubenpu.telemetry.skipped",
    "counter",
    "{item}",
    "Device telemetry files not used, by reason: missing (a listed driver file absent), "
    "unreadable (a read error: hwmon returns EIO/ENODATA for sensors off), malformed, "
    "out_of_range (past 2^63-1), counter_reset (the energy counter went down, not by a 32-bit "
    "wrap: the increment since is its new value).",
    ("reason",),
)
POD_ENERGY = Spec(
    "kubenpu.energy",
    "counter",
    "J",
    "Device energy split among pods by their share of the device's engine busy time in each "
    "fdinfo interval (docs/metrics.md#energy-per-pod). With the device's idle and unattributed "
    "shares it sums to kubenpu_device_energy_joules_total exactly (in whole microjoules).",
    _POD,
)
ENERGY_IDLE = Spec(
    "kubenpu.device.energy.idle",
    "counter",
    "J",
    "The device energy share of the time no DRM client kept an engine busy.",
    ("device", "vendor"),
)
ENERGY_UNATTRIBUTED = Spec(
    "kubenpu.device.energy.unattributed",
    "counter",
    "J",
    "The device energy share of busy time whose pod is not known (host processes, clients "
    "waiting for the CRI).",
    ("device", "vendor"),
)
TELEMETRY_SPECS = (
    POWER,
    POWER_LIMIT,
    ENERGY,
    TEMPERATURE,
    VOLTAGE,
    FREQUENCY,
    THROTTLE,
    MEMORY_USED,
    MEMORY_LIMIT,
    UTILIZATION,
    DEVICE_BUSY,
    ENERGY_IDLE,
    ENERGY_UNATTRIBUTED,
)
DESCRIPTORS_EXHAUSTED = Spec(
    "kubenpu.descriptors.exhausted",
    "counter",
    "{failure}",
    "Opens that failed with EMFILE or ENFILE (no file descriptor left), by where: cgroup_walk "
    "(a cgroup directory; its ids are looked for again), fdinfo (a process's fds, fdinfo or "
    "cgroup; its clients are read again), metrics_server (an accept).",
    ("where",),
)
TLS_EXPIRY = Spec(
    "kubenpu.tls.certificate.expiry_timestamp",
    "gauge",
    "s",
    "The earliest notAfter (Unix time) of the certificates in each configured TLS certificate "
    "file, by setting; checked at start.",
    ("setting",),
)
SPECS = (
    IOCTL,
    DEVICE_INFO,
    DROPPED,
    INDEX_REBUILDS,
    RECEIVED,
    UNATTRIBUTED,
    CRI_DURATION,
    CRI_ERRORS,
    EXPORT_ERRORS,
    IOCTL_SERIES,
    OVERFLOW_CALLS,
    LATE_SIGHTINGS,
    READ_ERRORS,
    PENDING_EXPIRED,
    ENGINE_BUSY,
    ENGINE_CYCLES,
    ENGINE_TOTAL_CYCLES,
    ENGINE_CAPACITY,
    MEMORY,
    FDINFO_SKIPPED,
    ALLOCATED,
    ALLOCATED_IDLE,
    ALLOCATED_IDLE_FOR,
    UNALLOCATED_CALLS,
    ALLOCATIONS_UNMAPPED,
    PODRESOURCES_ERRORS,
    *TELEMETRY_SPECS,
    TELEMETRY_SKIPPED,
    POD_ENERGY,
    DESCRIPTORS_EXHAUSTED,
    TLS_EXPIRY,
)
# The engine counters a Usage carries, by Spec, in the order of Usage.counters.
ENGINE_COUNTERS = (ENGINE_BUSY, ENGINE_CYCLES, ENGINE_TOTAL_CYCLES)


class Hist(NamedTuple):
    count: int
    total: float
    buckets: tuple[int, ...]  # per bucket, not cumulative; len(CRI_BOUNDS) + 1
    low: float
    high: float


class Point(NamedTuple):
    attrs: Attrs
    value: float | Hist
    start_ns: int


class Held(NamedTuple):
    """One container's allocation of one device."""

    namespace: str
    pod: str
    container: str
    device: str
    resource: str


@dataclass
class AllocationState:
    """What the allocations refresh last found: shares, idle seconds (with the time each was
    first held) and the current idle streak per Held, unallocated calls per user (with the time
    first seen), unmapped ids by
    (resource, reason)."""

    shares: dict[Held, int] = field(default_factory=dict)
    idle: dict[Held, tuple[float, int]] = field(default_factory=dict)
    idle_for: dict[Held, float] = field(default_factory=dict)
    unallocated: dict[tuple[str, str, str, str], tuple[int, int]] = field(default_factory=dict)
    unmapped: dict[tuple[str, str], int] = field(default_factory=dict)


class DeviceRow(NamedTuple):
    device: str
    vendor: str
    driver: str
    pci_id: str
    numa_node: str


class Where(NamedTuple):
    """The labels fdinfo series share: whose DRM client, on which device."""

    namespace: str
    pod: str
    container: str
    device: str
    vendor: str


# (container, device, vendor, engine) -> value, per engine counter Spec
_EngineKey = tuple[str, str, str, str]
# What retires as one: (namespace, pod, "") for a pod; (namespace, "", container) for a
# container without pod labels (started with ctr or nerdctl), whose name is its only identity.
_Unit = tuple[str, str, str]


def _finite(value: float) -> bool:
    """Whether value is a finite double, as Prometheus and OTLP's as_double carry it."""
    try:
        return math.isfinite(value)  # an int past ~1.8e308 raises: no double holds it
    except OverflowError:
        return False


def _unit(namespace: str, pod: str, container: str) -> _Unit:
    return (namespace, pod, "") if pod else (namespace, "", container)


@dataclass
class _Pod:
    start_ns: int
    live: set[str] = field(default_factory=set)
    series: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    engines: dict[Spec, dict[_EngineKey, float]] = field(default_factory=dict)


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
    """Counts per (namespace, pod, container, device, vendor, kind), plus self-metrics.

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
        self._nseries = 0
        self._overflow = 0
        self._devices: list[DeviceRow] = []
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._unattributed = dict.fromkeys(UNATTRIBUTED_REASONS, 0)
        self._received = 0
        self._rebuilds = 0
        self._cri = _Histogram()
        self._cri_errors = 0
        self._export_errors = 0
        self._late_sightings = 0
        self._read_errors = 0
        self._pending_expired = 0
        self._skipped = dict.fromkeys(SKIP_REASONS, 0)
        self._exhausted = dict.fromkeys(WHERE, 0)
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
    ) -> None:
        key = (container, device, vendor, kind)
        unit = _unit(namespace, pod, container)
        with self._lock:
            rec = self._pods.get(unit)
            if rec is None or key not in rec.series:
                if self._nseries >= self._max:
                    self._sweep()  # expired series must not hold room until the next collect
                    rec = self._pods.get(unit)
                if self._nseries >= self._max:
                    self._overflow += n
                    return
                if rec is None:
                    rec = self._pods[unit] = _Pod(time.time_ns())
                rec.series[key] = 0
                self._nseries += 1
            rec.series[key] += n
            self._live(rec, unit, container)

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
        unit = _unit(where.namespace, where.pod, where.container)
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

    def activity(self) -> dict[tuple[str, str, str, str], tuple[int, float]]:
        """Per (namespace, pod, container, device): the submit-class calls and the engine busy
        seconds plus cycles counted so far, the signals of use an idle allocation lacks."""
        use: dict[tuple[str, str, str, str], tuple[int, float]] = {}
        with self._lock:
            for (ns, pod, _), rec in self._pods.items():
                for (c, d, _v, k), n in rec.series.items():
                    if k == "submit":
                        calls, busy = use.get((ns, pod, c, d), (0, 0.0))
                        use[(ns, pod, c, d)] = (calls + n, busy)
                for spec in (ENGINE_BUSY, ENGINE_CYCLES):
                    for (c, d, _v, _e), value in rec.engines.get(spec, {}).items():
                        calls, busy = use.get((ns, pod, c, d), (0, 0.0))
                        use[(ns, pod, c, d)] = (calls, busy + value)
        return use

    def set_allocations(self, state: AllocationState) -> None:
        with self._lock:
            self._allocations = state

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
            self._telemetry[device] = list(points)

    def telemetry_skipped(self, reasons: dict[str, int]) -> None:
        with self._lock:
            for reason, n in reasons.items():
                self._telemetry_skipped[reason] = self._telemetry_skipped.get(reason, 0) + n

    def descriptors_exhausted(self, where: str, n: int = 1) -> None:
        with self._lock:
            self._exhausted[where] = self._exhausted.get(where, 0) + n

    def set_certificates(self, not_after: dict[str, float]) -> None:
        """Each configured certificate file's earliest notAfter, by setting."""
        with self._lock:
            self._certificates = dict(not_after)

    def container_gone(self, namespace: str, pod: str, container: str) -> None:
        """The container's cgroup is gone. Unknown containers are ignored."""
        unit = _unit(namespace, pod, container)
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

    def read_error(self) -> None:
        with self._lock:
            self._read_errors += 1

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
            self._nseries -= len(self._pods.pop(key).series)

    def collect(self) -> list[tuple[Spec, list[Point]]]:
        """Retire expired series, then snapshot every metric (cumulative values)."""
        with self._lock:
            self._sweep()
            return [
                (IOCTL, self._ioctl_points()),
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
                (LATE_SIGHTINGS, [Point({}, self._late_sightings, self._start_ns)]),
                (READ_ERRORS, [Point({}, self._read_errors, self._start_ns)]),
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
            Point(Where(ns, pod, c, d, v)._asdict(), uj / 1e6, rec.start_ns)
            for (ns, pod, _), rec in self._pods.items()
            for (c, d, v, _), uj in rec.engines.get(POD_ENERGY, {}).items()
        ]

    def _engine_points(self, spec: Spec) -> list[Point]:
        return [
            Point(
                {**Where(ns, pod, c, d, v)._asdict(), "engine": e},
                value,
                rec.start_ns,
            )
            for (ns, pod, _), rec in self._pods.items()
            for (c, d, v, e), value in rec.engines.get(spec, {}).items()
        ]

    def _gauge_points(self, values: dict, names: tuple[str, ...]) -> list[Point]:
        return [
            Point({**key[0]._asdict(), **dict(zip(names, key[1:], strict=True))}, v, self._start_ns)
            for key, v in values.items()
        ]

    def _ioctl_points(self) -> list[Point]:
        points = [
            Point(
                {"namespace": ns, "pod": pod, "container": c, "device": d, "vendor": v, "kind": k},
                n,
                rec.start_ns,
            )
            for (ns, pod, _), rec in self._pods.items()
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
