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
MINORS = "minors"  # u32 minor_index(major, minor) -> u32 vendor id + 1, 0 = not counted (array)
DEVICES = "devices"  # u32 dev_t -> u32 vendor id, for nodes MINORS cannot index (hash)
IOCTLS = "ioctls"  # u32 ioctl_index(vendor, nr) -> u32 kind, 0 = not counted (array)
LOST = "lost"  # u64 per CPU, by LOST_SLOTS index (per-CPU array)
EVENTS = "events"  # ring buffer of EVENT and BIRTH records
GATE = "gate"  # u32 at index 0: GATE_CLOSED / GATE_OPEN / GATE_HANDOVER (array)
COUNTS = "counts"  # COUNT_KEY -> u64 per CPU (per-CPU hash, aggregate mode only)
MAPS = (MINORS, DEVICES, IOCTLS, LOST, EVENTS, GATE)  # every mode's; COUNTS in aggregate mode
DEVICES_ENTRIES = 256
COUNTS_ENTRIES = 16384  # the default size of `counts`
PAGE = 4096  # the ring buffer is sized in pages

# struct count_key: u64 cgroup_id, u32 rdev, u32 kind
COUNT_KEY = struct.Struct("=QII")


class CountKey(ctypes.Structure):
    """COUNT_KEY as a ctypes array element, for batch reads."""

    _fields_ = [
        ("cgroup_id", ctypes.c_uint64),
        ("rdev", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
    ]


U32 = struct.Struct("=I")  # the key of `devices`, `ioctls`, `lost`, `gate`; their u32 values
U64 = struct.Struct("=Q")  # one CPU's slot of `lost` and `counts`

# --- the device table: DRM and accel nodes in an array, any other node in a hash -----------------
DRM_MAJOR, ACCEL_MAJOR = 226, 261  # include/drm/drm.h's DRM_MAJOR, drm_accel.h's ACCEL_MAJOR
MINOR_SLOTS = 256  # per major
MINORS_ENTRIES = 2 * MINOR_SLOTS


def minor_index(major: int, minor: int) -> int | None:
    """The `minors` slot of a node; None for a node only the `devices` hash can hold."""
    if major in (DRM_MAJOR, ACCEL_MAJOR) and minor < MINOR_SLOTS:
        return (major == ACCEL_MAJOR) << 8 | minor
    return None


# --- the ioctl table -----------------------------------------------------------------------------
DRM_IOCTL_TYPE = ord("d")
DRM_COMMAND_BASE, DRM_COMMAND_END = 0x40, 0xA0  # driver-specific nrs; outside: the DRM core's
VENDOR_CORE = 0  # the DRM core table applies to every vendor; plug-ins are numbered from 1
VENDOR_SLOTS = 64  # vendor ids 0..63
IOCTL_SLOTS = VENDOR_SLOTS * 256


def ioctl_index(vendor: int, nr: int) -> int:
    """The `ioctls` slot of {vendor id, nr}; the kernel uses VENDOR_CORE for core nrs."""
    return vendor << 8 | nr


# --- the gate: whether a program counts (docs/pinning.md, hand-over) ------------------------------
GATE_CLOSED, GATE_OPEN, GATE_HANDOVER = 0, 1, 2

# --- the `lost` slots, by index (LOST_* in the C source) ----------------------------------------
LOST_SLOTS = ("ringbuf_full", "map_full", "late_sighting", "handover")

# --- every map's shape: a pinned map is adopted only if it matches (docs/pinning.md) ----------
# enum bpf_map_type (include/uapi/linux/bpf.h)
MAP_TYPE_HASH, MAP_TYPE_ARRAY, MAP_TYPE_PERCPU_HASH, MAP_TYPE_PERCPU_ARRAY = 1, 2, 5, 6
MAP_TYPE_RINGBUF = 27


class MapShape(NamedTuple):
    """What struct bpf_map_info says of a map, and what a pinned map must match to be adopted."""

    type: int
    key_size: int
    value_size: int
    max_entries: int


def map_shapes(aggregate: bool, ringbuf_pages: int, counts_entries: int) -> dict[str, MapShape]:
    """Every map of a program built with these sizes (MAPS, and COUNTS in aggregate mode)."""
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
        shapes[COUNTS] = MapShape(MAP_TYPE_PERCPU_HASH, COUNT_KEY.size, u64, counts_entries)
    return shapes


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
