"""The access guard's kernel side (bpf/guard.bpf.c, docs/guard.md): BPF LSM programs on
file_open and file_receive, and opt-in (guard.ioctl) on file_ioctl (+ file_ioctl_compat where
the kernel has it), loaded with the same system libbpf as the counting probe, and the maps the
agent writes its policy into.

The maps are written through `Maps` (real fds here, a fake as strict as the kernel in the unit
tests), by `Writer`, in an order that never denies because of a half-written policy: grants
before the pods they are for, a pod's removal before its grants.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from kubenpu.kernel import bpfsys, hooks
from kubenpu.kernel.core import OBJECTS, shared_libbpf
from kubenpu.kernel.errors import Cause, ProbeError

OBJECT = "kubenpu-guard.bpf.o"
# The names and numbers of bpf/guard.bpf.c, in its order.
MODES = ("off", "audit", "enforce")
OPERATIONS = ("open", "ioctl", "receive")
VERDICTS = ("allowed", "denied", "audited", "failed_open", "unseen")
CONFIG, GUARDED, PODS, ALLOWED, TALLY = "guard_config", "guarded", "pods", "allowed", "tally"
MAP_NAMES = (CONFIG, GUARDED, PODS, ALLOWED, TALLY)
CONFIG_VALUE = struct.Struct("=QQQII")  # heartbeat_ns, fail_open_ns, kubepods_id, level, pad
U32, U64, U8 = struct.Struct("=I"), struct.Struct("=Q"), struct.Struct("=B")
POD = struct.Struct("=II")  # pod number, mode
ACCESS = struct.Struct("=II")  # pod number, dev_t
TALLY_KEY = struct.Struct("=QIBBH")  # cgroup id, dev_t, operation, verdict, pad
# Where a process gets an fd: always loaded. Each ioctl: only with guard.ioctl (every ioctl of
# every process on the node then pays the LSM trampoline, docs/performance.md).
PROGRAMS = ("guard_file_open", "guard_file_receive")
IOCTL = "guard_file_ioctl"
COMPAT = ("bpf_lsm_file_ioctl_compat", "guard_file_ioctl_compat")  # from 6.8
LSM_LIST = Path("/sys/kernel/security/lsm")


def mkdev(major: int, minor: int) -> int:
    """The kernel's internal dev_t (MKDEV), as inode->i_rdev holds it."""
    return major << 20 | minor


def lsm_active(path: Path = LSM_LIST) -> bool:
    """Whether BPF LSM programs run on this kernel: `bpf` among the active LSMs (CONFIG_BPF_LSM
    and `bpf` in CONFIG_LSM or lsm=). A kernel without it loads the programs and never calls
    them."""
    try:
        return "bpf" in path.read_text().strip().split(",")
    except OSError:
        return False


NEEDED = ("BPF", "PERFMON")  # measured by tests/test_guard_vm.py; CAP_SYS_ADMIN includes both


def check(lsm: Path = LSM_LIST, status: Path = Path("/proc/self/status")) -> None:
    """Raises ProbeError with the one line that says why the guard cannot work here: the kernel
    does not run the BPF LSM, or the agent lacks the capabilities (the guard is then off, and
    counting goes on)."""
    if not lsm_active(lsm):
        raise ProbeError(
            f"the kernel does not run the BPF LSM (no `bpf` in {lsm}: CONFIG_BPF_LSM and "
            "CONFIG_LSM or lsm=): the access guard is off, counting goes on (docs/guard.md)"
        )
    held = hooks.effective_capabilities(status)
    if "SYS_ADMIN" not in held and not set(NEEDED) <= held:
        missing = ", ".join(f"CAP_{c}" for c in NEEDED if c not in held)
        raise ProbeError(
            f"the access guard needs {missing} to load its LSM programs: the guard is off, "
            "counting goes on (docs/guard.md)",
            Cause.CAPABILITIES,
        )


@dataclass(frozen=True)
class Policy:
    """What the kernel is to hold: the guarded devices, each pod cgroup's pod and mode, and the
    (pod, device) pairs allowed."""

    guarded: frozenset[int] = frozenset()  # dev_t
    pods: dict[int, tuple[int, int]] = field(default_factory=dict)  # cgroup id -> (pod, mode)
    allowed: frozenset[tuple[int, int]] = frozenset()  # (pod, dev_t)


@dataclass(frozen=True)
class Clock:
    """The heartbeat's settings: the program fails open once the last beat is older than
    `fail_open_ns`; `kubepods` is (cgroup id, level) of kubepods(.slice), (0, 0) when unknown."""

    fail_open_ns: int
    kubepods: tuple[int, int] = (0, 0)


class Maps(Protocol):
    def update(self, name: str, key: bytes, value: bytes) -> None: ...

    def delete(self, name: str, key: bytes) -> bool: ...

    def keys(self, name: str) -> list[bytes]: ...

    def lookup(self, name: str, key: bytes) -> bytes | None: ...


# Each map's key size, for listing its keys.
KEY_SIZES = {CONFIG: 4, GUARDED: 4, PODS: 8, ALLOWED: ACCESS.size, TALLY: TALLY_KEY.size}
VALUE_SIZES = {CONFIG: CONFIG_VALUE.size, GUARDED: 1, PODS: POD.size, ALLOWED: 1, TALLY: 8}


class FdMaps:
    """The loaded object's maps, by name, through the bpf syscall."""

    def __init__(self, fds: dict[str, int]) -> None:
        self.fds = fds

    def update(self, name: str, key: bytes, value: bytes) -> None:
        bpfsys.update(self.fds[name], key, value)

    def delete(self, name: str, key: bytes) -> bool:
        return bpfsys.delete(self.fds[name], key)

    def keys(self, name: str) -> list[bytes]:
        return bpfsys.keys(self.fds[name], KEY_SIZES[name])

    def lookup(self, name: str, key: bytes) -> bytes | None:
        return bpfsys.lookup(self.fds[name], key, VALUE_SIZES[name])


class Writer:
    """Brings the kernel's policy maps to a Policy, changing only what differs."""

    def __init__(self, maps: Maps) -> None:
        self.maps = maps
        self.held = Policy()

    def apply(self, policy: Policy) -> None:
        old, one = self.held, U8.pack(1)
        for pod, dev in policy.allowed - old.allowed:  # grants first: a new pod is never denied
            self.maps.update(ALLOWED, ACCESS.pack(pod, dev), one)
        for cgroup_id, (pod, mode) in policy.pods.items():
            if old.pods.get(cgroup_id) != (pod, mode):
                self.maps.update(PODS, U64.pack(cgroup_id), POD.pack(pod, mode))
        for dev in policy.guarded - old.guarded:
            self.maps.update(GUARDED, U32.pack(dev), one)
        for dev in old.guarded - policy.guarded:
            self.maps.delete(GUARDED, U32.pack(dev))
        for cgroup_id in old.pods.keys() - policy.pods.keys():
            self.maps.delete(PODS, U64.pack(cgroup_id))
        for pod, dev in old.allowed - policy.allowed:  # a pod's removal before its grants'
            self.maps.delete(ALLOWED, ACCESS.pack(pod, dev))
        self.held = policy

    def beat(self, now_ns: int, clock: Clock) -> None:
        """The heartbeat: `now_ns` is CLOCK_MONOTONIC (time.monotonic_ns), bpf_ktime_get_ns's."""
        value = CONFIG_VALUE.pack(now_ns, clock.fail_open_ns, *clock.kubepods, 0)
        self.maps.update(CONFIG, U32.pack(0), value)

    def tallies(self) -> dict[tuple[int, int, str, str], int]:
        """Every (cgroup id, dev_t, operation, verdict)'s count, cumulative."""
        found = {}
        for raw in self.maps.keys(TALLY):
            value = self.maps.lookup(TALLY, raw)
            if value is not None:
                cgroup_id, dev, op, verdict, _ = TALLY_KEY.unpack(raw)
                found[cgroup_id, dev, OPERATIONS[op], VERDICTS[verdict]] = U64.unpack(value)[0]
        return found

    def forget(self, cgroup_ids: Iterable[int]) -> None:
        """Delete the tallies of gone cgroups (once their last counts are read)."""
        gone = set(cgroup_ids)
        for raw in self.maps.keys(TALLY):
            if TALLY_KEY.unpack(raw)[0] in gone:
                self.maps.delete(TALLY, raw)


def programs(ioctl: bool, kallsyms: Path) -> set[str]:
    """The programs to load and attach: the rest are not loaded (autoload off), so no program
    of the guard sits on file_ioctl unless `ioctl` asks for it."""
    found = set(PROGRAMS)
    if ioctl:
        found.add(IOCTL)
        symbol, compat = COMPAT
        if hooks.kernel_symbols({symbol}, kallsyms, "bpf_lsm_"):
            found.add(compat)
    return found


class GuardKernel:
    """start() once (ProbeError with why not); the writer from one thread; close() detaches.
    `ioctl`: also check every ioctl of a guarded device (guard.ioctl)."""

    def __init__(
        self,
        path: Path | None = None,
        kallsyms: Path = Path("/proc/kallsyms"),
        ioctl: bool = False,
    ) -> None:
        self._path = path or OBJECTS / OBJECT
        self._kallsyms = kallsyms
        self._ioctl = ioctl
        self._lib = None
        self._obj: int | None = None
        self._links: list[int] = []
        self.writer: Writer | None = None

    def start(self, policy: Policy, clock: Clock, now_ns: int) -> str:
        """Load, write the policy and a first beat, then attach: no program runs before its maps
        hold the policy. Call check() first."""
        if not self._path.exists():
            raise ProbeError(f"the guard object {self._path} is missing (build it with `make bpf`)")
        wanted = programs(self._ioctl, self._kallsyms)
        try:
            self._lib = lib = shared_libbpf()
            lib.messages.clear()
            self._obj = lib.open(self._path)
            lib.load(self._obj, wanted, "the guard object")
            fds = {n: lib.lib.bpf_map__fd(lib.find_map(self._obj, n)) for n in MAP_NAMES}
            self.writer = Writer(FdMaps(fds))
            self.writer.beat(now_ns, clock)
            self.writer.apply(policy)
            for name in sorted(wanted):
                self._links.append(lib.attach(self._obj, name))
        except ProbeError:
            self.close()
            raise
        return "lsm " + "+".join(p.removeprefix("guard_") for p in sorted(wanted))

    def close(self) -> None:
        """Detach and unload: no program of the guard is left in the kernel."""
        if self._lib is None:
            return
        self._lib.unload(self._links, self._obj)
        self._links.clear()
        self._obj = None
        self.writer = None
