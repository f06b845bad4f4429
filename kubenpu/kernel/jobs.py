"""The GPU jobs probe (bpf/jobs.bpf.c, docs/jobs.md): its own CO-RE object on the DRM GPU
scheduler's tracepoints, loaded with the same system libbpf as the counting probe. The
scheduler is a module (gpu_sched): its tracepoints exist once a driver built on it is loaded,
so start() can fail now and succeed later (kubenpu.sources.jobs retries it).

Two flavours, by capability. With CAP_SYS_ADMIN, tp_btf programs and fentry on the timeout
work: libbpf finds the module's BTF object to attach them (BPF_BTF_GET_NEXT_ID, GET_FD_BY_ID,
which only CAP_SYS_ADMIN may call). With CAP_BPF + CAP_PERFMON alone (the chart's), raw
tracepoints, attached by name, whose field reads libbpf relocates against vmlinux's and the
module's BTF read from /sys/kernel/btf (kubenpu.kernel.btf).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from kubenpu.kernel import abi, bpfsys, btf, hooks
from kubenpu.kernel.core import OBJECTS, shared_libbpf
from kubenpu.kernel.errors import Cause, ProbeError
from kubenpu.kernel.records import Durations, JobStep, JobTimes, job_step


class Ring(NamedTuple):
    name: str  # the scheduler's: gfx_0.0.0, testdrm-ring
    device: str  # its device's name: a PCI address, or a platform device's name


MODULE = "gpu_sched"  # drivers/gpu/drm/scheduler's gpu-sched.ko
_NEEDS = ("BPF", "PERFMON")  # without CAP_SYS_ADMIN: the raw_tp flavour's
_TRACEPOINT_SYMBOLS = {f"__tracepoint_{t}" for v in abi.JOB_TRACEPOINTS for t, _ in v}


def _scheduler_symbols(kallsyms: Path) -> set[str]:
    """The scheduler's names of abi.JOB_TRACEPOINTS and abi.JOB_TIMEOUT this kernel has, in
    one pass (each holds "drm_": other lines are skipped unsplit)."""
    return hooks.kernel_symbols(_TRACEPOINT_SYMBOLS | {abi.JOB_TIMEOUT[0]}, kallsyms, "drm_")


def _variant(names: set[str]) -> tuple[tuple[str, str], ...] | None:
    for variant in abi.JOB_TRACEPOINTS:
        if all(f"__tracepoint_{tracepoint}" in names for tracepoint, _ in variant):
            return variant
    return None


def tracepoints(kallsyms: Path = Path("/proc/kallsyms")) -> tuple[tuple[str, str], ...] | None:
    """The (tracepoint, program) set of abi.JOB_TRACEPOINTS this kernel has; None before a
    driver on the scheduler is loaded (or on a kernel without it)."""
    return _variant(_scheduler_symbols(kallsyms))


def _module_names(modules: Path) -> frozenset[str] | None:
    """The loaded modules' names (not their use counts, which change with every open of a
    device); None where the kernel has no /proc/modules (no module support)."""
    try:
        return frozenset(line.split(maxsplit=1)[0] for line in modules.read_text().splitlines())
    except (OSError, IndexError):
        return None


def _histogram(sum_ns: int, slots: tuple[int, ...]) -> Durations:
    return Durations(sum_ns, slots, ())


class JobsKernel:
    """start() once (it raises ProbeError with why not); read() from one thread; close()."""

    def __init__(
        self,
        path: Path | None = None,
        kallsyms: Path = Path("/proc/kallsyms"),
        modules: Path = Path("/proc/modules"),
        btf_root: Path = btf.SYSFS,
    ) -> None:
        self._path = path or OBJECTS / abi.JOBS_OBJECT
        self._btf_root = btf_root
        self._kallsyms = kallsyms
        self._modules = modules
        self._absent_with: frozenset[str] | None = None  # the modules of the last scan that failed
        self._lib = None
        self._obj: int | None = None
        self._links: list[int] = []
        self._maps = JobMaps({})
        self._events: bpfsys.RingBuffer | None = None
        self._read: list[JobStep] = []  # what the ring buffer's callback decoded, until taken

    def available(self) -> bool:
        """Whether the kernel has the scheduler's tracepoints now (a driver on it is loaded).
        They come with a module: kallsyms is scanned again only once the loaded modules changed
        since a scan that did not find them. This is asked at every retry, on most nodes for
        good, and a scan took 1.3 s of CPU under TCG."""
        modules = _module_names(self._modules)
        if modules is not None and modules == self._absent_with:
            return False
        found = tracepoints(self._kallsyms) is not None
        self._absent_with = None if found else modules
        return found

    def check(self) -> None:
        """Raises ProbeError (Cause.CAPABILITIES) when no load could ever succeed."""
        held = hooks.effective_capabilities()
        if missing := [] if "SYS_ADMIN" in held else [c for c in _NEEDS if c not in held]:
            raise ProbeError(
                f"the GPU jobs probe needs CAP_BPF + CAP_PERFMON, missing "
                f"{', '.join(f'CAP_{c}' for c in missing)} (docs/jobs.md)",
                Cause.CAPABILITIES,
            )

    def start(self) -> str:
        """Load and attach; call check() first (kubenpu.sources.jobs does, once). The line
        returned names the flavour: tp_btf with CAP_SYS_ADMIN, else raw_tp."""
        names = _scheduler_symbols(self._kallsyms)  # the tracepoints and the timeout work
        variant = _variant(names)
        if variant is None:
            raise ProbeError("no DRM GPU scheduler tracepoints (no driver on gpu_sched loaded)")
        if not self._path.exists():
            raise ProbeError(f"the jobs object {self._path} is missing (build it with `make bpf`)")
        tracepoints = ", ".join(tracepoint for tracepoint, _ in variant)
        programs = {program for _, program in variant}
        if "SYS_ADMIN" not in hooks.effective_capabilities():
            return self._start_raw(f"raw_tp {tracepoints}", {p + abi.RAW for p in programs})
        function, timeout = abi.JOB_TIMEOUT
        if function not in names:
            self._load_or_close(programs)
            return f"tp_btf {tracepoints}; no {function}: no reset victims"
        return self._with_timeout(f"tp_btf {tracepoints}", programs, f"fentry {function}", timeout)

    def _start_raw(self, how: str, programs: set[str]) -> str:
        """The raw_tp flavour, its reads relocated against the module's BTF from sysfs, handed
        to libbpf as a memfd (the container's root may be read-only)."""
        whole = btf.module(MODULE, self._btf_root)
        fd = os.memfd_create(f"kubenpu-{MODULE}.btf")
        try:
            with open(fd, "wb", closefd=False) as out:
                out.write(whole)
            path = Path(f"/proc/self/fd/{fd}")
            tracepoint, timeout = abi.JOB_TIMEOUT_RAW
            return self._with_timeout(how, programs, f"raw_tp {tracepoint}", timeout, path)
        finally:
            os.close(fd)

    def _with_timeout(
        self, how: str, programs: set[str], at: str, timeout: str, path: Path | None = None
    ) -> str:
        try:  # the victims are an extra: the jobs are counted without them
            self._load_or_close(programs | {timeout}, path)
        except ProbeError as exc:
            self._load_or_close(programs, path)
            return f"{how}; {at} failed ({exc}): no reset victims"
        return f"{how}; {at}"

    def _load_or_close(self, programs: set[str], btf_path: Path | None = None) -> None:
        try:
            self._load(programs, btf_path)
        except ProbeError:
            self.close()
            raise

    def _load(self, programs: set[str], btf_path: Path | None) -> None:
        self._lib = lib = shared_libbpf()
        lib.messages.clear()
        self._obj = lib.open(self._path, btf_path)
        lib.load(self._obj, programs, "the jobs object")
        names = (abi.JOB_TIMES, abi.RINGS, abi.JOB_LOST, abi.JOB_EVENTS)
        self._maps = JobMaps({n: lib.lib.bpf_map__fd(lib.find_map(self._obj, n)) for n in names})
        try:
            self._events = bpfsys.RingBuffer(self._maps.fds[abi.JOB_EVENTS], self._decoded)
        except bpfsys.BpfError as exc:
            raise ProbeError(f"the jobs' ring buffer: {exc}") from exc
        for name in sorted(programs):
            self._links.append(lib.attach(self._obj, name))

    def read(self) -> dict[tuple[int, int], JobTimes]:
        return self._maps.read()

    def _decoded(self, raw: bytes) -> None:
        self._read.append(job_step(raw))

    def events(self) -> list[JobStep]:
        """The job steps recorded since the last call (the ring buffer consumed, not waited
        on)."""
        if self._events is not None:
            self._events.poll(0)
        found, self._read = self._read, []
        return found

    def rings(self) -> dict[int, Ring]:
        return self._maps.rings()

    def lost(self) -> dict[str, int]:
        return self._maps.lost()

    def forget(self, cgroup_ids: Iterable[int]) -> None:
        self._maps.forget(cgroup_ids)

    def close(self) -> None:
        if self._lib is None:
            return
        if self._events is not None:
            self._events.close()
            self._events = None
        self._lib.unload(self._links, self._obj)
        self._links.clear()
        self._obj = None
        self._maps = JobMaps({})


class JobMaps:
    """The jobs object's maps, by name (abi.JOB_TIMES, abi.RINGS, abi.JOB_LOST), read and
    pruned from user space."""

    def __init__(self, fds: dict[str, int]) -> None:
        self.fds = fds

    def read(self) -> dict[tuple[int, int], JobTimes]:
        """Every {cgroup id, ring address}'s jobs, cumulative."""
        fd, found = self.fds[abi.JOB_TIMES], {}
        slots = abi.DURATION_SLOTS
        for raw_key in bpfsys.keys(fd, abi.JOB_KEY.size):
            raw = bpfsys.lookup(fd, raw_key, abi.JOB_TIMES_VALUE.size)
            if raw is None:
                continue
            v = abi.JOB_TIMES_VALUE.unpack(raw)
            wait = _histogram(v[2], v[5 : 5 + slots])
            found[abi.JOB_KEY.unpack(raw_key)] = JobTimes(
                v[0], v[1], wait, _histogram(v[3], v[5 + slots :]), v[4]
            )
        return found

    def rings(self) -> dict[int, Ring]:
        fd, found = self.fds[abi.RINGS], {}
        for raw_key in bpfsys.keys(fd, 8):
            raw = bpfsys.lookup(fd, raw_key, abi.RING.size)
            if raw is not None:
                name, device = (
                    b.split(b"\0", 1)[0].decode(errors="replace") for b in abi.RING.unpack(raw)
                )
                found[int.from_bytes(raw_key, "little")] = Ring(name, device)
        return found

    def lost(self) -> dict[str, int]:
        fd = self.fds[abi.JOB_LOST]
        return {
            reason: int.from_bytes(
                bpfsys.lookup(fd, i.to_bytes(4, "little"), 8) or bytes(8), "little"
            )
            for i, reason in enumerate(abi.JOB_LOST_REASONS)
        }

    def forget(self, cgroup_ids: Iterable[int]) -> None:
        """Delete the keys of gone cgroups from job_times (they stop counting against its room)."""
        gone, fd = set(cgroup_ids), self.fds[abi.JOB_TIMES]
        for raw_key in bpfsys.keys(fd, abi.JOB_KEY.size):
            if abi.JOB_KEY.unpack(raw_key)[0] in gone:
                bpfsys.delete(fd, raw_key)
