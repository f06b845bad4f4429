"""The description of every metric the agent exports: its name, kind, unit, labels and help,
the Prometheus names derived from them, and the reason tuples of the reason-labelled counters.
Both exporters and `kubenpuctl top` read it; kubenpu.metrics.series holds the values. It imports
nothing of the agent's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

# The reason vocabularies, each the one list of its names: the stages that count by them import
# them from here, so the catalogue imports no stage.


class Drop(StrEnum):
    """Why calls were lost (kubenpu_events_dropped_total{reason})."""

    RINGBUF_FULL = "ringbuf_full"  # events mode: the kernel ring buffer had no room
    MAP_FULL = "map_full"  # aggregate mode: the counts map had no room for a new key
    QUEUE_FULL = "queue_full"  # a batch already held probe.queue_size distinct keys
    DEVICE_UNKNOWN = "device_unknown"  # a call on a device the agent did not list
    BAD_RECORD = "bad_record"  # a ring-buffer record that could not be decoded
    # a call made while a new probe took over from a pinned one (docs/pinning.md): counted once
    # by the retiring probe or not at all; an upper bound of the calls a hand-over lost
    HANDOVER = "handover"


class Skip(StrEnum):
    """Why something found during a scan was not (fully) used. One owner for these names."""

    VANISHED = "vanished"  # the process or fd went away between listing and reading
    UNREADABLE = "unreadable"  # no ptrace-read access (EACCES/EPERM) or another read error
    # EMFILE/ENFILE: the agent had no descriptor left; what the process holds is unknown.
    NO_DESCRIPTORS = "no_descriptors"
    MALFORMED = "malformed"  # one drm- line whose value breaks the spec; the rest is kept
    # A value past what the wire formats carry (OTLP int64): a u64 -1 that a driver prints for
    # "unknown", or a KiB size that scales past 2^63. The rest of the file is kept.
    OUT_OF_RANGE = "out_of_range"
    NO_CLIENT_ID = "no_client_id"  # a DRM fd without drm-client-id: the driver prints no stats
    UNKNOWN_DEVICE = "unknown_device"  # no drm-pdev and a node discovery does not list


class Unattributed(StrEnum):
    """Why a cgroup's calls carry empty (or partial) pod labels; the one list of these names."""

    NOT_INDEXED = "not_indexed"  # no cgroup with this id under the cgroup root
    NOT_POD = "not_pod"  # a host process, or a container kubelet did not create
    CONTAINER_NOT_FOUND = "container_not_found"  # in a pod, but no container the runtime knows
    CRI_ERROR = "cri_error"  # the runtime did not answer
    # The runtime's labels break Kubernetes' own length limits (cri.LABEL_LIMITS): a hostile or
    # broken runtime's megabyte of pod name is not made a label of every series.
    LABEL_TOO_LONG = "label_too_long"
    # Not a resolver answer: the agent held calls for a pending lookup, but its table was full.
    PENDING_FULL = "pending_full"


Attrs = dict[str, str | bool]

OVERFLOW_ATTRS: Attrs = {"otel.metric.overflow": True}
# The semantic conventions' version whose names the OTLP push (export.otlp.attributes: semconv)
# was checked against (tests/test_semconv.py; docs/metrics.md lists where it departs): its
# requests say so in schema_url, so a receiver can translate them when names change.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
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

# A pod's identity: our label (/metrics) -> the OTel semantic conventions' attribute (stable, in
# open-telemetry/semantic-conventions model/k8s/registry.yaml), the name OTLP points carry with
# export.otlp.attributes: semconv, so they join the Collector's k8sattributes and kubeletstats
# data. The one table of it: export.otlp renames by it, tests and docs read it.
K8S_ATTRIBUTES = {
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "pod_uid": "k8s.pod.uid",
    "container": "k8s.container.name",
}
# The labels that name whose calls, engine time, memory or energy a series counts.
POD_LABELS = ("namespace", "pod", "pod_uid", "container")
CRI_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class Spec:
    """One metric. `name` and `unit` are OTel's; `prometheus_name` derives the Prometheus name
    exactly as Prometheus' own OTLP translation does."""

    name: str
    # An updowncounter (a sum that can fall: semconv's memory sizes) is a gauge on /metrics.
    kind: Literal["counter", "updowncounter", "gauge", "histogram"]
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    # The Prometheus name where it differs from the translation of `name` (semconv's hw.* names
    # become kubenpu_device_*: docs/metrics.md lists each).
    prometheus: str = ""
    integer: bool = False  # OTLP points carry as_int (semconv's metric_value_type: int)
    # The OTLP name of an accel (NPU) device's points where `name` is a hw.gpu.* one: semconv
    # has no NPU type yet (docs/metrics.md, Hardware attributes on OTLP).
    npu: str = ""
    # Labels whose OTLP attribute is a semantic conventions' one where /metrics keeps our own
    # name (model/hardware/registry.yaml, error.type): export.otlp renames by it.
    attributes: tuple[tuple[str, str], ...] = ()

    @property
    def prometheus_kind(self) -> str:
        return "gauge" if self.kind == "updowncounter" else self.kind

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
        # _ratio is for OTLP gauges only (prometheus/otlptranslator's normalizeName): an
        # updowncounter, a non-monotonic sum on the wire, gets none, through the Collector too.
        if self.unit == "1" and self.kind != "gauge":
            unit = ""
        if unit and not name.endswith("_" + unit):
            name += "_" + unit
        return name + "_total" if self.kind == "counter" else name


IOCTL = Spec(
    "kubenpu.ioctl",
    "counter",
    "{call}",
    "Driver ioctl calls (submit, alloc, wait) made by processes, per container and device. "
    "Counts calls, not utilisation.",
    (*POD_LABELS, "device", "vendor", "kind"),
)
IOCTL_DURATION = Spec(
    "kubenpu.ioctl.duration",
    "histogram",
    "s",
    "How long counted driver calls took, from the hook's entry to the call's return, per "
    "container and device; the kernel's buckets (docs/latency.md). CO-RE loader, aggregate mode.",
    (*POD_LABELS, "device", "vendor", "kind"),
)
# GPU jobs from the DRM GPU scheduler's tracepoints (bpf/jobs.bpf.c, kubenpu/jobs.py): the
# pod is the cgroup of the task that queued the job.
_JOB_LABELS = (*POD_LABELS, "device", "vendor", "ring")
JOB_WAIT = Spec(
    "kubenpu.job.wait.duration",
    "histogram",
    "s",
    "How long GPU jobs waited from queued to running on the device's ring (the DRM GPU "
    "scheduler's queue: behind other jobs, and on their dependencies), per pod, device and "
    "ring; the kernel's buckets, those of kubenpu_ioctl_duration_seconds (docs/jobs.md).",
    _JOB_LABELS,
)
JOB_RUN = Spec(
    "kubenpu.job.run.duration",
    "histogram",
    "s",
    "How long GPU jobs ran on the device, from the scheduler handing them to the driver to "
    "their fence signalling done, per pod, device and ring (docs/jobs.md).",
    _JOB_LABELS,
)
JOBS = Spec(
    "kubenpu.jobs",
    "counter",
    "{job}",
    "GPU jobs done, per pod, device and ring (the count of the job histograms).",
    _JOB_LABELS,
)
JOBS_IN_FLIGHT = Spec(
    "kubenpu.jobs.in_flight",
    "gauge",
    "{job}",
    "GPU jobs queued and not yet done, per pod, device and ring, at the last read.",
    _JOB_LABELS,
)
JOB_WAIT_BEHIND = Spec(
    "kubenpu.job.wait.behind",
    "counter",
    "s",
    "GPU job queue wait spent while another pod's jobs ran on the ring (behind_namespace, "
    "behind_pod; the pod itself where it waited behind its own), per pod, device and ring: each "
    "interval's wait split over the running pods by their running jobs. With "
    "kubenpu_job_wait_idle_seconds_total it sums to the pod's queue wait (docs/jobs.md#who-is-"
    "in-my-way). Past metrics.max_behind_pairs pairs on a ring, behind_pod is other.",
    (*_JOB_LABELS, "behind_namespace", "behind_pod"),
)
JOB_WAIT_IDLE = Spec(
    "kubenpu.job.wait.idle",
    "counter",
    "s",
    "GPU job queue wait spent while no job ran on the ring (on the job's dependencies, or the "
    "scheduler's own latency), per pod, device and ring (docs/jobs.md#who-is-in-my-way).",
    _JOB_LABELS,
)
POD_HANGS = Spec(
    "kubenpu.pod.device.hangs",
    "counter",
    "{reset}",
    "Device resets (DRM wedged uevents) whose guilty task, as the kernel named it (PID=; amdgpu "
    "names the hung job's owner), was the container's (docs/jobs.md#hangs).",
    (*POD_LABELS, "device", "vendor"),
)
RESET_VICTIMS = Spec(
    "kubenpu.pod.device.reset_victim",
    "counter",
    "{reset}",
    "Device resets whose scheduler timeout found the container's GPU jobs in flight on the ring "
    "(queued and not done, the guilty container's aside): its work then was lost or resubmitted.",
    (*POD_LABELS, "device", "vendor"),
)
JOBS_LOST = Spec(
    "kubenpu.jobs.lost",
    "counter",
    "{job}",
    "GPU job events the kernel side could not use, by reason: unmatched (a run or done of a job "
    "not seen queued: queued before the probe attached), keys_full (no room for a new {cgroup, "
    "ring} in the kernel's table: the job is not in the histograms), events_full (no room in "
    "the kernel's ring buffer of job steps: the blocked-by seconds miss the step), events_late "
    "(a job step read after its ring was replayed past it: replayed late).",
    ("reason",),
)
IOCTL_REMOTE_NODE = Spec(
    "kubenpu.ioctl.remote_node",
    "counter",
    "{call}",
    "Counted driver calls made from a CPU on another NUMA node than the device's, per container "
    "and device (docs/placement.md); the calls are also in kubenpu_ioctl_total. Not exported for "
    "a device without a NUMA node. Aggregate mode.",
    (*POD_LABELS, "device", "vendor", "kind"),
)
IOCTL_ERRORS = Spec(
    "kubenpu.ioctl.errors",
    "counter",
    "{call}",
    "Counted driver calls that failed, by errno name (EINTR, EAGAIN, ETIME, ETIMEDOUT, ENOMEM, "
    "ENOSPC, EINVAL, ENOENT, EFAULT, EPERM, EACCES, EIO, ENODEV, ECANCELED, other); the calls "
    "are also in kubenpu_ioctl_total.",
    (*POD_LABELS, "device", "vendor", "kind", "error"),
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
    "kubenpu_ioctl_total series currently held (with the allocation and telemetry series at "
    "most metrics.max_series, plus overflow).",
)
OVERFLOW_CALLS = Spec(
    "kubenpu.overflow_calls",
    "counter",
    "{call}",
    'Calls counted in the kubenpu_ioctl_total{otel_metric_overflow="true"} series because '
    "metrics.max_series was reached.",
)
# What holds series beside kubenpu_ioctl_total under metrics.max_series, and whose series the
# cap leaves out (kubenpu.overflow_series).
SERIES_SOURCES = ("allocations", "telemetry", "durations", "jobs", "resets")
OVERFLOW_SERIES = Spec(
    "kubenpu.overflow_series",
    "counter",
    "{series}",
    "Series left out of an allocations refresh, a device telemetry read, a read of the "
    "kernel's call durations or of its GPU jobs, or a pod's device reset count, because "
    "metrics.max_series was reached, by source; counted at every refresh or read that leaves "
    "them out.",
    ("source",),
)
REFUSED = Spec(
    "kubenpu.series.refused",
    "counter",
    "{update}",
    "Updates of a pod's call durations, GPU jobs or reset counts refused because no exporter "
    "could carry the result (a histogram past 2^64-1 observations, which OTLP holds as uint64: "
    "a series sums its cgroups, a restarted container's two; a count past a double), by source; "
    "the series keeps its last value, and each read that offers the update counts again.",
    ("source",),
)
LATE_SIGHTINGS = Spec(
    "kubenpu.sightings.late",
    "counter",
    "{sighting}",
    "New keys (aggregate mode) and new cgroups (births, both modes) the kernel ring buffer had "
    "no room to announce. No call is lost; the cgroup is resolved later, from a walk of the "
    "cgroup tree, instead of at once.",
)
UNTIMED = Spec(
    "kubenpu.ioctl.untimed",
    "counter",
    "{call}",
    "Counted calls whose duration the kernel could not keep: its durations map had no room for "
    "a new key, or the task no storage for the call's entry. The call is counted; only its "
    "duration and return value are missing from kubenpu_ioctl_duration_seconds.",
)
DURATIONS_FORGOTTEN = Spec(
    "kubenpu.ioctl.durations.forgotten",
    "counter",
    "{key}",
    "Keys of the kernel's durations map deleted with no count and a cgroup the tree does not "
    "know (gone: a key an earlier agent left in a pinned map, or one timed after its counts "
    "were forgotten). Nothing can name them, so their durations are not exported.",
)
READ_ERRORS = Spec(
    "kubenpu.probe.read.errors",
    "counter",
    "{read}",
    "Reads of the kernel's counters that failed; retried at the next read, which loses nothing.",
)
# The sources of kubenpu.counters.read_timestamp, and the counters each brings up to date.
COUNTER_SOURCES = ("kernel", "fdinfo", "jobs", "telemetry", "allocations", "guard")
COUNTERS_READ = Spec(
    "kubenpu.counters.read_timestamp",
    "gauge",
    "s",
    "When (Unix time) the counters were last brought up to date, by source: kernel (calls, "
    "drops and unattributed calls), fdinfo (engine time), jobs (GPU job histograms), telemetry "
    "(energy), allocations (idle time). Rate a counter over the change of its source's "
    "timestamp, not over the time between two scrapes.",
    ("source",),
)
# What the framework keeps of every source's reads (kubenpu.sources.Report).
SOURCE_READ_DURATION = Spec(
    "kubenpu.source.read.duration",
    "gauge",
    "s",
    "How long each source's last successful read took, by source.",
    ("source",),
)
SOURCE_ERRORS = Spec(
    "kubenpu.source.errors",
    "counter",
    "{read}",
    "Reads of a source that failed, by source; the first failure of a streak is logged, and the "
    "recovery, and the next read retries.",
    ("source",),
)
PENDING_EXPIRED = Spec(
    "kubenpu.pending.expired_calls",
    "counter",
    "{call}",
    "Calls held while the CRI could not name their pod, then counted with empty pod labels "
    "after attribution.pending_seconds.",
)
# The calls held now: a wrong or slow CRI socket shows here, not as a silent hole in the calls.
PENDING_CALLS = Spec(
    "kubenpu.pending.calls",
    "gauge",
    "{call}",
    "Calls held now because the CRI has not named their pod yet: counted under their pod when "
    "it answers, else with empty pod labels after attribution.pending_seconds. Above 0 for more "
    "than a few seconds: the CRI socket is wrong, down or slow (kubenpu_cri_errors_total).",
    integer=True,
)
PENDING_AGE = Spec(
    "kubenpu.pending.age",
    "gauge",
    "s",
    "How long the oldest held calls (kubenpu_pending_calls) have waited for their pod's name; "
    "0 when none are held. They are counted when it reaches attribution.pending_seconds.",
)
# Whether restarts, upgrades and uninstall keep their guarantees (docs/pinning.md).
PROBE_PINNED = Spec(
    "kubenpu.probe.pinned",
    "gauge",
    "",
    "1 when the probe is pinned in bpffs (probe.pin_dir): it counts on across agent restarts "
    "and upgrades, and uninstall can remove it. 0 when it stops with the agent: no pin_dir, "
    "events mode, no bpffs or a read-only one, or BCC's kprobe attach (the start log says "
    "which).",
    integer=True,
)
_POD = (*POD_LABELS, "device", "vendor")
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
    ("namespace", "pod", "pod_uid", "container", "device", "resource"),
)
ALLOCATED_IDLE = Spec(
    "kubenpu.device.allocated.idle",
    "counter",
    "s",
    "Time the container held the allocation with no submit-class call on the device and no "
    "engine busy time (or cycles) on it (docs/metrics.md, Idle allocations).",
    ("namespace", "pod", "pod_uid", "container", "device", "resource"),
)
ALLOCATED_IDLE_FOR = Spec(
    "kubenpu.device.allocated.idle_for",
    "gauge",
    "s",
    "How long the allocation has been idle without a break, at the last refresh (0 while used).",
    ("namespace", "pod", "pod_uid", "container", "device", "resource"),
)
UNALLOCATED_CALLS = Spec(
    "kubenpu.device.unallocated_calls",
    "counter",
    "{call}",
    "Submit-class calls a pod's container made on a device that some allocation on the node "
    "names, or that the kubelet can allocate, while the container was allocated none of it "
    "(seen at each allocations refresh); host processes' calls are not counted. The calls are "
    "counted in kubenpu_ioctl_total all the same.",
    ("namespace", "pod", "pod_uid", "container", "device"),
)
ALLOCATIONS_UNMAPPED = Spec(
    "kubenpu.allocations.unmapped",
    "gauge",
    "{id}",
    "Allocated ids held now that map to no discovered device, by resource and reason: empty_id, "
    "unknown_format (no known id format and no PCI address or node name in it), no_device (it "
    "names a device discovery did not find), serial_unresolvable (a Gaudi serial that the "
    "plugin's NUMA node does not narrow to one card), monitoring (Intel's monitoring resource: "
    "every GPU's telemetry, not an allocation), empty_pod (an entry without a pod or container "
    "name).",
    ("resource", "reason"),
)
# The access guard (docs/guard.md): its kernel tallies, summed by pod (or by device) at each
# policy refresh.
ACCESS_DENIED = Spec(
    "kubenpu.device.access_denied",
    "counter",
    "{access}",
    "Opens, receipts (an fd passed over a unix socket or taken with pidfd_getfd) and ioctls "
    "of a guarded device node the access guard denied a pod (mode enforce: "
    "EPERM) or would have denied it (mode audit: allowed), because the kubelet did not allocate "
    "the device to the pod and no allow rule names it. `operation`: open, receive, or ioctl "
    "(only with guard.ioctl).",
    ("namespace", "pod", "pod_uid", "device", "operation", "mode"),
)
ACCESS_UNCHECKED = Spec(
    "kubenpu.device.access_unchecked",
    "counter",
    "{access}",
    "Opens, receipts (an fd passed over a unix socket or taken with pidfd_getfd) and ioctls "
    "of a guarded device node the access guard let through unchecked: by a "
    "pod cgroup its policy did not hold yet (reason unseen: the agent had not seen the pod), "
    "or that it would have denied while the agent's heartbeat was stale (reason failed_open).",
    ("device", "operation", "reason"),
)
ACCESS_POLICY = Spec(
    "kubenpu.device.access_policy",
    "gauge",
    "{pod}",
    "The access guard's policy at its last refresh: 1 for each guarded pod (its mode not off) "
    "and guarded device, with `access` allocated (the kubelet allocated it the device), "
    "allow_rule (a guard.allow rule names it) or denied (opens, receipts and ioctls denied in "
    "enforce, counted in audit).",
    ("namespace", "pod", "pod_uid", "device", "mode", "access"),
)
PODRESOURCES_ERRORS = Spec(
    "kubenpu.podresources.errors",
    "counter",
    "{request}",
    "PodResources requests to the kubelet that failed or timed out: a List, retried at the next "
    "refresh, or a connection's one GetAllocatableResources (then not available on it).",
)
# Device telemetry from sysfs and hwmon (kubenpu/telemetry.py): OTel hardware semantic
# conventions' names where they have one. A device's points carry these (hw.vendor where the
# vendor is known), plus the kind's own labels, plus HW_DESCRIPTIVE where the driver publishes
# them. A sensor (temperature, voltage) is a component of its own, as semconv has it: hw.id
# names the sensor, hw.parent its device, whose hw.name, hw.vendor and descriptive attributes
# it does not repeat.
_HW = ("device", "vendor", "hw.id", "hw.type", "hw.vendor", "hw.name")
_SENSOR = ("device", "vendor", "hw.id", "hw.type", "hw.parent", "sensor", "chip")
_LOCATION = (("sensor", "hw.sensor_location"),)
_LIMIT = (*_LOCATION, ("limit", "hw.limit_type"))
# semconv's recommended descriptive attributes (model/hardware/gpu-metrics.yaml), on every
# telemetry point of a device whose driver publishes them (telemetry.DESCRIPTIVE_FILES).
HW_DESCRIPTIVE = ("hw.model", "hw.serial_number", "hw.firmware_version", "hw.driver_version")
POWER = Spec(
    "hw.power",
    "gauge",
    "W",
    "Device power now, per sensor: hwmon powerN_input or powerN_average; source=derived when "
    "the driver has only an energy counter (i915, xe): its increase over the last interval.",
    (*_HW, "sensor", "chip", "source"),
    "kubenpu.device.power",
    attributes=_LOCATION,
)
POWER_LIMIT = Spec(
    "kubenpu.device.power.limit",
    "gauge",
    "W",
    "Device power limits, per sensor and limit, as semconv's hw.limit_type: throttled (hwmon "
    "powerN_cap, habanalabs max_power), max (powerN_max), critical (powerN_crit), rated_max "
    "(powerN_rated_max).",
    (*_HW, "sensor", "chip", "limit"),
    attributes=_LIMIT,
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
    "names it: edge, junction, mem). hw.type is temperature, hw.parent the device.",
    _SENSOR,
    "kubenpu.device.temperature",
    attributes=_LOCATION,
)
TEMPERATURE_LIMIT = Spec(
    "hw.temperature.limit",
    "gauge",
    "Cel",
    "Device temperature limits per sensor, as semconv's hw.limit_type: high.degraded (hwmon "
    "tempN_max), high.critical (tempN_crit), high.emergency (tempN_emergency, above critical).",
    (*_SENSOR, "limit"),
    "kubenpu.device.temperature.limit",
    attributes=_LIMIT,
)
VOLTAGE = Spec(
    "hw.voltage",
    "gauge",
    "V",
    "Device voltage per sensor (hwmon inN_input). hw.type is voltage, hw.parent the device.",
    _SENSOR,
    "kubenpu.device.voltage",
    attributes=_LOCATION,
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
    "1",
    "1 while the driver reports the device throttled for reason (i915 throttle_reason_*, xe "
    "throttle/reason_*; status is any reason), else 0.",
    (*_HW, "domain", "reason"),
)
MEMORY_USED = Spec(
    "hw.gpu.memory.usage",
    "updowncounter",
    "By",
    "Device memory in use (amdgpu mem_info_vram_used, ivpu npu_memory_utilization).",
    (*_HW, "region"),
    "kubenpu.device.memory.used",
    integer=True,
    npu="kubenpu.npu.memory.usage",
)
MEMORY_LIMIT = Spec(
    "hw.gpu.memory.limit",
    "updowncounter",
    "By",
    "Device memory size (amdgpu mem_info_vram_total).",
    (*_HW, "region"),
    "kubenpu.device.memory.limit",
    integer=True,
    npu="kubenpu.npu.memory.limit",
)
MEMORY_UTILIZATION = Spec(
    "hw.gpu.memory.utilization",
    "gauge",
    "1",
    "The fraction of device memory in use: memory used over memory size, per region, where "
    "the driver gives both (amdgpu).",
    (*_HW, "region"),
    "kubenpu.device.memory.utilization",
    npu="kubenpu.npu.memory.utilization",
)
UTILIZATION = Spec(
    "hw.gpu.utilization",
    "gauge",
    "1",
    "Device busy fraction as the driver reports it, by semconv's hw.gpu.task: general (amdgpu "
    "gpu_busy_percent).",
    (*_HW, "task"),
    "kubenpu.device.utilization",
    npu="kubenpu.npu.utilization",
    attributes=(("task", "hw.gpu.task"),),
)
DEVICE_ERRORS = Spec(
    "hw.errors",
    "counter",
    "{error}",
    "Hardware errors the driver counted since it loaded, per block and type (corrected, "
    "uncorrected, deferred): amdgpu RAS ras/<block>_err_count (ce:, ue:, de: lines).",
    (*_HW, "block", "type"),
    "kubenpu.device.errors",
    integer=True,
    attributes=(("type", "error.type"),),
)
DEVICE_STATUS = Spec(
    "hw.status",
    "updowncounter",
    "1",
    "1 for the device's state now, 0 for the others (ok, degraded, failed; semconv's hw.state): "
    "failed after a DRM wedged uevent that asks for a recovery (WEDGED= other than none) until "
    "the device is added again; else degraded while the driver counts uncorrected errors; else "
    "ok (docs/metrics.md#device-health).",
    (*_HW, "state"),
    "kubenpu.device.status",
    integer=True,
    attributes=(("state", "hw.state"),),
)
MEMORY_BUSY = Spec(
    "kubenpu.device.memory.busy",
    "gauge",
    "1",
    "The fraction of time the device's memory controller was busy, as the driver reports it "
    "(amdgpu mem_busy_percent); not a GPU task, so not hw.gpu.utilization.",
    _HW,
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
    "wrap, to a value the device could have made since a restart: the increment since is its "
    "new value), counter_implausible (the energy counter rose by more, or fell to more, than "
    "the device could make in the interval: no energy counted, the value is the next "
    "baseline), power_implausible (a power reading past what the device can draw, 2 x its "
    "highest power limit or 3000 W: no energy integrated for the interval), deadline (a "
    "device's read still running telemetry.deadline_seconds after it "
    "was due, counted at every read it holds up).",
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
TELEMETRY_STALE = Spec(
    "kubenpu.device.telemetry.stale",
    "gauge",
    "",
    "1 while the device's last sysfs/hwmon read did not finish within telemetry.deadline_seconds "
    "(a driver can block sysfs reads during a reset): its other telemetry series keep the values "
    "of its last finished read; else 0.",
    ("device", "vendor"),
)
TELEMETRY_SPECS = (
    POWER,
    POWER_LIMIT,
    ENERGY,
    TEMPERATURE,
    TEMPERATURE_LIMIT,
    VOLTAGE,
    FREQUENCY,
    THROTTLE,
    MEMORY_USED,
    MEMORY_LIMIT,
    MEMORY_UTILIZATION,
    UTILIZATION,
    MEMORY_BUSY,
    DEVICE_BUSY,
    DEVICE_ERRORS,
    DEVICE_STATUS,
    ENERGY_IDLE,
    ENERGY_UNATTRIBUTED,
    TELEMETRY_STALE,
)
DEVICE_RESETS = Spec(
    "kubenpu.device.resets",
    "counter",
    "{reset}",
    "DRM wedged uevents per device, by the recovery the driver asks for (WEDGED=: none after a "
    "reset that recovered it, rebind, bus-reset, vendor-specific, several in that order joined by "
    "commas, unknown; other for any other value; drivers/gpu/drm/drm_drv.c drm_dev_wedged_event).",
    ("device", "vendor", "method"),
)
DEVICE_COREDUMPS = Spec(
    "kubenpu.device.coredumps",
    "counter",
    "{dump}",
    "Device coredumps the kernel announced for the device (a devcoredump add uevent whose "
    "failing_device is it; drivers/base/devcoredump.c): a driver captures one on a hang.",
    ("device", "vendor"),
)
UEVENT_SKIPS = ("malformed", "unknown_device", "overrun")
UEVENTS_SKIPPED = Spec(
    "kubenpu.uevents.skipped",
    "counter",
    "{uevent}",
    "Kernel uevents read and not used, by reason: malformed (not a kernel uevent; or a field "
    "that breaks its format, a PID= that is no pid: the reset counts, with no guilty task), "
    "unknown_device (a DRM or devcoredump event of a device the agent does not list); overrun "
    "counts the times the socket's buffer overflowed (ENOBUFS: the kernel dropped events, how "
    "many it does not say).",
    ("reason",),
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
    IOCTL_DURATION,
    IOCTL_ERRORS,
    IOCTL_REMOTE_NODE,
    JOB_WAIT,
    JOB_RUN,
    JOBS,
    JOBS_IN_FLIGHT,
    JOB_WAIT_BEHIND,
    JOB_WAIT_IDLE,
    JOBS_LOST,
    POD_HANGS,
    RESET_VICTIMS,
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
    OVERFLOW_SERIES,
    REFUSED,
    LATE_SIGHTINGS,
    UNTIMED,
    DURATIONS_FORGOTTEN,
    READ_ERRORS,
    COUNTERS_READ,
    SOURCE_READ_DURATION,
    SOURCE_ERRORS,
    PENDING_EXPIRED,
    PENDING_CALLS,
    PENDING_AGE,
    PROBE_PINNED,
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
    ACCESS_DENIED,
    ACCESS_UNCHECKED,
    ACCESS_POLICY,
    *TELEMETRY_SPECS,
    TELEMETRY_SKIPPED,
    POD_ENERGY,
    DEVICE_RESETS,
    DEVICE_COREDUMPS,
    UEVENTS_SKIPPED,
    DESCRIPTORS_EXHAUSTED,
    TLS_EXPIRY,
)
# The engine counters a Usage carries, by Spec, in the order of Usage.counters.
ENGINE_COUNTERS = (ENGINE_BUSY, ENGINE_CYCLES, ENGINE_TOTAL_CYCLES)
# Every label renamed on OTLP, to its attribute: deploy/otel renames back for remote write.
HW_ATTRIBUTES = {label: attr for spec in SPECS for label, attr in spec.attributes}
