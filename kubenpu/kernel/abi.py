"""What bpf/kubenpu.bpf.c and Python must agree on, in one place: struct layouts, the dev_t
encoding, map names and sizes, the ioctl table's index, the gate values, the `lost` slots and
the program names. tests/test_abi.py reads the C source and checks every value here against it,
so the two cannot drift. Nothing else in kubenpu packs or unpacks kernel records.
"""

from __future__ import annotations

import ctypes
import struct
from typing import NamedTuple

# --- records on the `events` ring buffer ----------------------------------------------------------
# struct event: u64 ts_ns, u64 cgroup_id, u32 tgid, u32 cmd, u32 major, u32 minor, u32 kind, u32 pad
EVENT = struct.Struct("<QQIIIIII")
# struct birth: u64 cgroup_id, u64 parent_id (a new cgroup; told from an event by its size)
BIRTH = struct.Struct("<QQ")

# --- the kernel-internal dev_t (MKDEV), not the 8/12-bit one of stat(2) --------------------------
MINOR_BITS = 20


def dev_t(major: int, minor: int) -> int:
    """The kernel-internal dev_t, which keys the `devices` and `counts` maps."""
    return major << MINOR_BITS | minor


def split_dev_t(rdev: int) -> tuple[int, int]:
    """(major, minor) of a kernel-internal dev_t."""
    return rdev >> MINOR_BITS, rdev & ((1 << MINOR_BITS) - 1)


# --- maps ----------------------------------------------------------------------------------------
MINORS = "minors"  # u32 minor_index(major, minor) -> device_entry() + 1, 0 = not counted (array)
DEVICES = "devices"  # u32 dev_t -> u32 device_entry(), for nodes MINORS cannot index (hash)
IOCTLS = "ioctls"  # u32 ioctl_index(vendor, nr) -> u32 kind, 0 = not counted (array)
LOST = "lost"  # u64 per CPU, by LOST_SLOTS index (per-CPU array)
EVENTS = "events"  # ring buffer of EVENT and BIRTH records
GATE = "gate"  # u32 at index 0: GATE_CLOSED / GATE_OPEN / GATE_HANDOVER (array)
COUNTS = "counts"  # COUNT_KEY -> COUNT_VALUE per CPU (per-CPU hash, aggregate mode only)
MAPS = (MINORS, DEVICES, IOCTLS, LOST, EVENTS, GATE)  # every mode's; COUNTS in aggregate mode
DEVICES_ENTRIES = 256
COUNTS_ENTRIES = 16384  # the default size of `counts`
PAGE = 4096  # the ring buffer is sized in pages

# struct count_key: u64 cgroup_id, u32 rdev, u32 kind
COUNT_KEY = struct.Struct("=QII")


# struct count_value: u64 calls, u64 remote (those of the calls made from a CPU on another NUMA node
# than the device's: docs/placement.md), bumped in the same update
COUNT_VALUE = struct.Struct("=QQ")


class CountKey(ctypes.Structure):
    """COUNT_KEY as a ctypes array element, for batch reads."""

    _fields_ = [
        ("cgroup_id", ctypes.c_uint64),
        ("rdev", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
    ]


U32 = struct.Struct("=I")  # the key of `devices`, `ioctls`, `lost`, `gate`; their u32 values
U64 = struct.Struct("=Q")  # one CPU's slot of `lost`

# --- the device table: DRM and accel nodes in an array, any other node in a hash -----------------
DRM_MAJOR, ACCEL_MAJOR = 226, 261  # include/drm/drm.h's DRM_MAJOR, drm_accel.h's ACCEL_MAJOR
MINOR_SLOTS = 256  # per major
MINORS_ENTRIES = 2 * MINOR_SLOTS


# A device table value: the vendor id in the low bits, the device's NUMA node + 1 from
# DEVICE_NODE_SHIFT (0: no node; none of its calls is remote). `minors` holds it + 1.
DEVICE_NODE_SHIFT = 16
DEVICE_VENDOR_MASK = 0xFFFF


def device_entry(vendor: int, numa_node: int | None) -> int:
    """The `devices` value of a device of this vendor id on this NUMA node (None or -1: none)."""
    node = 0 if numa_node is None or numa_node < 0 else numa_node + 1
    return node << DEVICE_NODE_SHIFT | vendor


def minor_index(major: int, minor: int) -> int | None:
    """The `minors` slot of a node; None for a node only the `devices` hash can hold."""
    if major in (DRM_MAJOR, ACCEL_MAJOR) and minor < MINOR_SLOTS:
        return (major == ACCEL_MAJOR) << 8 | minor
    return None


# --- the ioctl table -----------------------------------------------------------------------------
DRM_IOCTL_TYPE = ord("d")
# driver-specific nrs; outside: the DRM core's. The plug-ins' tables hold raw nrs and need no
# range; tests/test_vendors.py checks them against this one.
DRM_COMMAND_BASE, DRM_COMMAND_END = 0x40, 0xA0
VENDOR_CORE = 0  # the DRM core table applies to every vendor; plug-ins are numbered from 1
VENDOR_SLOTS = 64  # vendor ids 0..63
IOCTL_SLOTS = VENDOR_SLOTS * 256


def ioctl_index(vendor: int, nr: int) -> int:
    """The `ioctls` slot of {vendor id, nr}; the kernel uses VENDOR_CORE for core nrs."""
    return vendor << 8 | nr


# --- the gate: whether a program counts (docs/pinning.md, hand-over) ------------------------------
GATE_CLOSED, GATE_OPEN, GATE_HANDOVER = 0, 1, 2
GATE_STATE = 3  # the bits of the state above
# A bit beside the state: counted calls are timed (probe.durations; the CO-RE aggregate object).
# One value the entry reads once (it was a `timing` map of its own, an array read more per call).
GATE_TIMED = 4

# --- the `lost` slots, by index (LOST_* in the C source) ----------------------------------------
LOST_SLOTS = ("ringbuf_full", "map_full", "late_sighting", "handover", "untimed")

# --- every map's shape: a pinned map is adopted only if it matches (docs/pinning.md) ----------
# enum bpf_map_type (include/uapi/linux/bpf.h)
MAP_TYPE_HASH, MAP_TYPE_ARRAY, MAP_TYPE_PERCPU_HASH, MAP_TYPE_PERCPU_ARRAY = 1, 2, 5, 6
MAP_TYPE_RINGBUF, MAP_TYPE_TASK_STORAGE = 27, 29


class MapShape(NamedTuple):
    """What struct bpf_map_info says of a map, and what a pinned map must match to be adopted."""

    type: int
    key_size: int
    value_size: int
    max_entries: int


def map_shapes(
    aggregate: bool, ringbuf_pages: int, counts_entries: int, durations_entries: int = 0
) -> dict[str, MapShape]:
    """Every map of a program built with these sizes (MAPS, COUNTS in aggregate mode, and the
    durations maps where durations_entries is set: the CO-RE aggregate object)."""
    u32, u64 = U32.size, U64.size
    shapes = {
        MINORS: MapShape(MAP_TYPE_ARRAY, u32, u32, MINORS_ENTRIES),
        DEVICES: MapShape(MAP_TYPE_HASH, u32, u32, DEVICES_ENTRIES),
        IOCTLS: MapShape(MAP_TYPE_ARRAY, u32, u32, IOCTL_SLOTS),
        LOST: MapShape(MAP_TYPE_PERCPU_ARRAY, u32, u64, len(LOST_SLOTS)),
        EVENTS: MapShape(MAP_TYPE_RINGBUF, 0, 0, ringbuf_pages * PAGE),
        GATE: MapShape(MAP_TYPE_ARRAY, u32, u32, 1),
    }
    if aggregate:
        value = COUNT_VALUE.size
        shapes[COUNTS] = MapShape(MAP_TYPE_PERCPU_HASH, COUNT_KEY.size, value, counts_entries)
    if durations_entries:
        value = DURATION_VALUE.size
        shapes[DURATIONS] = MapShape(MAP_TYPE_HASH, COUNT_KEY.size, value, durations_entries)
        shapes[STARTS] = MapShape(MAP_TYPE_TASK_STORAGE, u32, START.size, 0)
        shapes[TEMPLATE] = MapShape(MAP_TYPE_ARRAY, u32, value, 1)
    return shapes


# --- durations and return values of counted calls (docs/latency.md) ------------------------------
# Aggregate mode, CO-RE loader. The entry (the hook's fentry) keeps {ts, rdev, kind} in the task's
# storage; the exit (EXIT_PROGRAMS) adds the call to `durations`, a hash shared by the CPUs
# (atomic adds: per-CPU values would be DURATION_VALUE x CPUs x keys, 125 MB at 128 CPUs and
# 1,000 keys).
DURATIONS = "durations"  # COUNT_KEY -> DURATION_VALUE (hash)
STARTS = "starts"  # task storage: the task's counted call in flight
TEMPLATE = "template"  # one zero DURATION_VALUE a new key is inserted from (array)
DURATION_MAPS = (DURATIONS, STARTS, TEMPLATE)  # whether calls are timed: GATE_TIMED
DURATIONS_ENTRIES = 4096  # the default size of `durations`: 4,096 x 976 B = 3.8 MiB
# The buckets are those of an OpenTelemetry exponential histogram at scale 2 (and a Prometheus
# native histogram at schema 2), in seconds: bucket index i holds (2^(i/4), 2^((i+1)/4)].
SCALE = 2
FIRST_INDEX = -80  # (2^-20 s, 2^-19.75 s]: from 0.95 us
BUCKETS = 104  # indexes FIRST_INDEX .. FIRST_INDEX + 103: up to 2^6 s = 64 s
# A value's slots: [0] at most 2^-20 s (under), [1 + i - FIRST_INDEX] bucket i, [BUCKETS + 1] over
# 64 s.
DURATION_SLOTS = BUCKETS + 2
# The kernel's bucket math, integer only (bpf/kubenpu.bpf.c duration_slot, mirrored below): ns
# to units of 2^-40 s (a unit is 1 ppm of the first edge) as ns * NS_TO_UNITS >> 16, then the
# power of two and which quarter of it.
NS_TO_UNITS = 72057594  # round(2^40 / 10^9 * 2^16)
OVER_NS = 64_000_000_000
QUARTERS = (0x9837F0518DB8A800, 0xB504F333F9DE6800, 0xD744FCCAD69D6800)  # 2^(q/4) * 2^63
# The return values counted by name (errno numbers of include/uapi/asm-generic/errno*.h and
# include/linux/errno.h); any other negative value is `other`. The restart codes a signal leaves
# before the syscall returns read as EINTR, as the caller sees them.
ERRNOS = {
    "EINTR": (4, 512, 513, 514, 516),  # + ERESTARTSYS, _NOINTR, _NOHAND, _RESTARTBLOCK
    "EAGAIN": (11,),
    "ETIME": (62,),
    "ETIMEDOUT": (110,),
    "ENOMEM": (12,),
    "ENOSPC": (28,),
    "EINVAL": (22,),
    "ENOENT": (2,),
    "EFAULT": (14,),
    "EPERM": (1,),
    "EACCES": (13,),
    "EIO": (5,),
    "ENODEV": (19,),
    "ECANCELED": (125,),
}
ERRORS = (*ERRNOS, "other")  # a value's error slots, in this order
# struct start: u64 ts_ns, u64 cgroup_id, u32 rdev, u32 kind, u32 cmd, u32 _pad (the task's call in
# flight; drm_ioctl's exit matches rdev and cmd)
START = struct.Struct("=QQIIII")
# struct durations: u64 sum_ns, u64 slots[DURATION_SLOTS], u64 errors[len(ERRORS)]
DURATION_VALUE = struct.Struct(f"=Q{DURATION_SLOTS}Q{len(ERRORS)}Q")


def duration_slot(ns: int) -> int:
    """The slot the kernel adds a call of `ns` nanoseconds to (its integer math, step by step)."""
    if ns > OVER_NS:
        return BUCKETS + 1
    units = (ns * NS_TO_UNITS) >> 16
    if units <= 1 << 20:
        return 0
    below = units - 1  # an exact power of two ends the bucket under it
    power = below.bit_length() - 1
    top = (below << (63 - power)) & ((1 << 64) - 1)
    index = 4 * (power - 40) + sum(top > q for q in QUARTERS)
    return min(1 + index - FIRST_INDEX, BUCKETS + 1)


def error_slot(ret: int) -> int | None:
    """The error slot of a return value; None for a success (0 or more)."""
    if ret >= 0:
        return None
    for slot, numbers in enumerate(ERRNOS.values()):
        if -ret in numbers:
            return slot
    return len(ERRORS) - 1


# --- programs ------------------------------------------------------------------------------------
BIRTHS = "kubenpu_cgroup_mkdir"  # tp_btf/cgroup_mkdir
BIRTHS_TRACEPOINT = "cgroup_mkdir"
# The CO-RE object's ioctl program of each hookable function (fentry/<function>).
IOCTL_PROGRAMS = {
    "security_file_ioctl": "kubenpu_lsm_ioctl",
    "security_file_ioctl_compat": "kubenpu_lsm_compat",
    "drm_ioctl": "kubenpu_drm_ioctl",
}
LINK = "link-"  # the pin name of an attachment (a bpf_link): link-<function>
# The exits that end a timed call (probe.durations_exit): function -> the CO-RE object's fexit
# program. drm_ioctl's exit is passed by DRM calls alone; the ioctl syscall's return by every
# ioctl of the node (it also ends the calls a driver's wrapper fails before drm_ioctl). The
# object has the syscall names of its build's architecture; the loader attaches those the
# kernel has.
EXIT_PROGRAMS = {
    "syscall": {
        "__x64_sys_ioctl": "kubenpu_sys_exit",
        "__ia32_compat_sys_ioctl": "kubenpu_compat_exit",
        "__arm64_sys_ioctl": "kubenpu_sys_exit",
        "__arm64_compat_sys_ioctl": "kubenpu_compat_exit",
    },
    "drm_ioctl": {"drm_ioctl": "kubenpu_drm_exit"},
}
# The syscall names' prefixes of each architecture (os.uname().machine): asking kallsyms for
# another's would read it to its end on every start.
ARCH_SYSCALL_PREFIXES = {"x86_64": ("__x64_", "__ia32_"), "aarch64": ("__arm64_",)}


def exit_programs(exit: str, machine: str) -> dict[str, str]:
    """EXIT_PROGRAMS[exit] that a kernel of `machine` can have."""
    prefixes = ARCH_SYSCALL_PREFIXES.get(machine, ())
    return {
        f: p
        for f, p in EXIT_PROGRAMS[exit].items()
        if not f.startswith("__") or f.startswith(prefixes)
    }


# drm_ioctl's return as a kretprobe (kretprobe/drm_ioctl): the LSM hook's default exit where fexit
# cannot reach drm.ko's BTF (CAP_SYS_ADMIN); a perf-event kprobe needs CAP_BPF + CAP_PERFMON.
DRM_RETURN = {"drm_ioctl": "kubenpu_drm_return"}

EXIT_LINK = f"{LINK}exit-"  # the pin name of an exit's attachment: link-exit-<function>

# --- GPU jobs (bpf/jobs.bpf.c, its own object: docs/jobs.md) -----------------------------------
JOBS_OBJECT = "kubenpu-jobs.bpf.o"
JOBS = "jobs"  # u64 scheduler fence -> the job in flight (LRU hash)
JOB_TIMES = "job_times"  # JOB_KEY -> JOB_TIMES_VALUE (hash)
RINGS = "rings"  # u64 scheduler address -> RING (hash)
JOB_LOST = "job_lost"  # u64 per JOB_LOST reason (array)
JOB_LOST_REASONS = ("unmatched", "keys_full", "events_full")
JOB_EVENTS = "job_events"  # one JOB_EVENT per job step (ring buffer)
# struct job_event: u32 kind, tgid, u64 ts_ns, fence, ring, cgroup_id, client_id
JOB_EVENT = struct.Struct("=IIQQQQQ")
JOB_EVENT_KINDS = ("queued", "run", "done")  # by the record's kind
# struct job_key: u64 cgroup_id, u64 ring
JOB_KEY = struct.Struct("=QQ")
# struct job_times: u64 queued, done, wait_sum_ns, run_sum_ns, timeouts, wait[DURATION_SLOTS],
# run[DURATION_SLOTS]
JOB_TIMES_VALUE = struct.Struct(f"=5Q{DURATION_SLOTS}Q{DURATION_SLOTS}Q")
RING = struct.Struct("=32s32s")  # struct ring: char name[32], char device[32]
# The scheduler's timeout work (a static function of gpu_sched, in every kernel here) and the
# fentry program that counts the jobs in flight at it; jobs are counted without it.
JOB_TIMEOUT = ("drm_sched_job_timedout", "job_timedout")
# The raw_tp flavour (no CAP_SYS_ADMIN): each program of JOB_TRACEPOINTS is its name + RAW, and
# the timeout is seen where its work starts (bpf/jobs.bpf.c).
RAW = "_raw"
JOB_TIMEOUT_RAW = ("workqueue_execute_start", "job_timedout_raw")
# The scheduler's tracepoints by kernel, each set the programs that attach to them: (tracepoint,
# program) for queued, run, done. The loader attaches the first set whose tracepoints the kernel
# has (drivers/gpu/drm/scheduler/gpu_scheduler_trace.h).
JOB_TRACEPOINTS = (
    (  # 6.17 on
        ("drm_sched_job_queue", "job_queued"),
        ("drm_sched_job_run", "job_run"),
        ("drm_sched_job_done", "job_done"),
    ),
    (  # before
        ("drm_sched_job", "job_queued_6_1"),
        ("drm_run_job", "job_run_6_1"),
        ("drm_sched_process_job", "job_done_6_1"),
    ),
)
