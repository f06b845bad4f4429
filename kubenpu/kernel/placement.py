"""The placement scheduler's kernel side (bpf/placement.bpf.c, docs/scheduler.md): a sched_ext
scheduler in partial mode, loaded with the same system libbpf as the counting probe, the map of
preferred NUMA nodes per pod cgroup the agent writes, and the SCHED_EXT policy the agent gives
the tasks of those cgroups (only SCHED_EXT tasks are scheduled by it).

The scheduler lives as long as its struct_ops link: close() destroys it, and so does the
process's exit (the link is never pinned), so the kernel returns to its default scheduler when
the agent stops, however it stops.
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from kubenpu.kernel import bpfsys, hooks
from kubenpu.kernel.core import OBJECTS, shared_libbpf
from kubenpu.kernel.errors import Cause, ProbeError

OBJECT = "kubenpu-placement.bpf.o"
OPS, PREFER = "placement_ops", "prefer"  # the struct_ops map and the cgroup id -> node map
PROGRAMS = ("placement_select_cpu", "placement_enqueue", "placement_dispatch", "placement_init")
U64, U32 = struct.Struct("=Q"), struct.Struct("=I")
SCHED_EXT = 7  # include/uapi/linux/sched.h
# The policies a task may be moved from: the fair class's. Real-time and deadline tasks keep
# theirs.
FAIR_POLICIES = (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE)
SCHED_EXT_ROOT = Path("/sys/kernel/sched_ext")
# Measured by tests/test_placement_vm.py on 7.3: BPF + PERFMON load and register the scheduler
# (CAP_SYS_ADMIN includes both); setting the policy of another user's task needs CAP_SYS_NICE.
NEEDED = ("BPF", "PERFMON", "SYS_NICE")


def state(root: Path = SCHED_EXT_ROOT) -> str:
    """The kernel's sched_ext state: "disabled", "enabling", "enabled", "disabling"."""
    return (root / "state").read_text().strip()


def check(root: Path = SCHED_EXT_ROOT, status: Path = Path("/proc/self/status")) -> None:
    """Raises ProbeError with the one line that says why the scheduler cannot run here: no
    sched_ext in the kernel, another BPF scheduler loaded, or missing capabilities."""
    if not root.is_dir():
        raise ProbeError(
            f"the kernel has no sched_ext ({root}: CONFIG_SCHED_CLASS_EXT, 6.12 and later): the "
            "placement scheduler is off, the measurement goes on (docs/scheduler.md)"
        )
    if (now := state(root)) != "disabled":
        raise ProbeError(
            f"another sched_ext scheduler is {now} ({root}/root/ops): the placement scheduler "
            "is off, the measurement goes on (docs/scheduler.md)"
        )
    held = hooks.effective_capabilities(status)
    if "SYS_ADMIN" in held:
        held |= {"BPF", "PERFMON"}
    if missing := [c for c in NEEDED if c not in held]:
        raise ProbeError(
            f"the placement scheduler needs {', '.join(f'CAP_{c}' for c in missing)}: it is "
            "off, the measurement goes on (docs/scheduler.md)",
            Cause.CAPABILITIES,
        )


class Maps(Protocol):
    def update(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> bool: ...


class FdMap:
    """The loaded `prefer` map, through the bpf syscall."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def update(self, key: bytes, value: bytes) -> None:
        bpfsys.update(self.fd, key, value)

    def delete(self, key: bytes) -> bool:
        return bpfsys.delete(self.fd, key)


class Writer:
    """Brings the kernel's `prefer` map to {cgroup id: node}, changing only what differs."""

    def __init__(self, prefer: Maps) -> None:
        self.prefer = prefer
        self.held: dict[int, int] = {}

    def apply(self, wanted: Mapping[int, int]) -> None:
        for cgroup_id, node in wanted.items():
            if self.held.get(cgroup_id) != node:
                self.prefer.update(U64.pack(cgroup_id), U32.pack(node))
        for cgroup_id in self.held.keys() - wanted.keys():
            self.prefer.delete(U64.pack(cgroup_id))
        self.held = dict(wanted)


def to_sched_ext(tids: list[int]) -> int:
    """Gives the fair-class tasks among `tids` the SCHED_EXT policy (keeping their nice), so the
    scheduler sees them; returns how many changed. A task gone meanwhile is skipped."""
    changed = 0
    for tid in tids:
        try:
            if os.sched_getscheduler(tid) in FAIR_POLICIES:
                os.sched_setscheduler(tid, SCHED_EXT, os.sched_param(0))
                changed += 1
        except ProcessLookupError:
            continue
        except OSError as err:
            if err.errno != errno.ESRCH:
                raise
    return changed


class PlacementKernel:
    """start() once (ProbeError with why not); the writer from one thread; close() unloads."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path or OBJECTS / OBJECT
        self._lib = None
        self._obj: int | None = None
        self._link: int | None = None
        self.writer: Writer | None = None

    def start(self, prefer: Mapping[int, int]) -> None:
        """Load, write `prefer`, then register the scheduler. Call check() first."""
        if not self._path.exists():
            raise ProbeError(f"the placement object {self._path} is missing (build it: make bpf)")
        try:
            self._lib = lib = shared_libbpf()
            lib.messages.clear()
            self._obj = lib.open(self._path)
            lib.load(self._obj, set(PROGRAMS), "the placement scheduler")
            self.writer = Writer(FdMap(lib.lib.bpf_map__fd(lib.find_map(self._obj, PREFER))))
            self.writer.apply(prefer)
            self._link = lib.attach_struct_ops(self._obj, OPS)
        except ProbeError:
            self.close()
            raise

    def close(self) -> None:
        """Unregister and unload: the kernel's default scheduler again."""
        if self._lib is None:
            return
        self._lib.unload([self._link] if self._link else [], self._obj)
        self._link = self._obj = None
        self.writer = None
