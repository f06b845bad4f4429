"""The kernel side: compile bpf/kubenpu.bpf.c with BCC, fill its maps, attach it to the hook
(`probe.hook`), and feed what the kernel counted into a Tally.

`BccKernel` is the loaded program (the only code that touches BCC); `Probe` owns the probe mode
(``aggregate`` or ``events``) and turns the kernel's records and cumulative counters into Tally
increments. Tests replace the BccKernel with tests/fakes.py's FakeKernel.

Hooks (`probe.hook`):
- ``drm_ioctl``: the DRM core's ioctl entry, in drm.ko on most distributions. fentry on a module
  function needs the module's BTF object, which only CAP_SYS_ADMIN may look up;
- ``security_file_ioctl``: the LSM hook in vmlinux that every ioctl passes, plus
  security_file_ioctl_compat (32-bit callers) where the kernel has it; before that function
  existed, 32-bit calls passed security_file_ioctl itself. CAP_BPF + CAP_PERFMON suffice.

Attach variants (`probe.attach`), tried in this order under ``attach: auto``:
- ``fentry-module``: MODULE_KFUNC_PROBE(drm, drm_ioctl) when DRM is a module (BCC >= 0.28);
- ``fentry``: KFUNC_PROBE on a vmlinux function (drm_ioctl when DRM is built in, or the LSM hook);
- ``kprobe``: the fallback where fentry is unavailable. It reads kernel memory through
  bpf_probe_read, which lockdown=confidentiality forbids.
The maps are filled before the program is attached, so every call after attach is judged
against the full device and ioctl tables.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kubenpu import bpfsys
from kubenpu.discovery import Device
from kubenpu.events import (
    KERNEL_LOST,
    BadRecord,
    Birth,
    Deltas,
    Drop,
    Key,
    Tally,
    birth,
    dev_t,
    split_dev_t,
)
from kubenpu.vendors import all_vendors, core

log = logging.getLogger(__name__)

_ARGS = "struct file *filp, unsigned int cmd, unsigned long arg"
# The kernel's own C dialect flags (CC_FLAGS_DIALECT), which BCC 0.31 does not pass: from 6.19
# the headers embed tagged structs anonymously (struct filename in linux/fs.h), which clang only
# accepts with -fms-extensions. Older headers compile the same with them.
_DIALECT_CFLAGS = ("-fms-extensions", "-Wno-microsoft-anon-tag")
_SOURCE_CANDIDATES = (
    Path(__file__).parent / "bpf" / "kubenpu.bpf.c",  # installed wheel
    Path(__file__).parents[1] / "bpf" / "kubenpu.bpf.c",  # source tree / editable install
)


_BATCH = 4096  # keys per BPF_MAP_LOOKUP_BATCH call
LINK = "link-"  # the pin name of an attachment (a bpf_link): link-<function>
GATE_CLOSED, GATE_OPEN, GATE_HANDOVER = 0, 1, 2  # the `gate` map's values (bpf/kubenpu.bpf.c)


class ProbeError(Exception):
    """The probe could not be loaded, attached or read; the message is one line for the operator."""


@dataclass(frozen=True)
class Program:
    """One probe on one kernel function: the attach line that replaces KUBENPU_ATTACH."""

    function: str
    header: str
    fn_name: str


@dataclass(frozen=True)
class AttachPlan:
    attach: str  # fentry-module, fentry or kprobe
    programs: tuple[Program, ...]  # one per hooked function, all attached or none


# The functions of each hook: the compat LSM hook only exists from 6.8 (and stable backports).
_HOOK_FUNCTIONS = {
    "drm_ioctl": ("drm_ioctl",),
    "security_file_ioctl": ("security_file_ioctl", "security_file_ioctl_compat"),
}
_OPTIONAL_FUNCTIONS = {"security_file_ioctl_compat"}


def kernel_has(function: str, kallsyms: Path = Path("/proc/kallsyms")) -> bool:
    """Whether the running kernel has `function` (names are readable without privileges)."""
    with kallsyms.open() as f:
        return any(line.split(maxsplit=3)[2:3] == [function] for line in f)


def attach_plans(
    attach: str,
    hook: str = "drm_ioctl",
    btf_dir: Path = Path("/sys/kernel/btf"),
    kallsyms: Path = Path("/proc/kallsyms"),
) -> list[AttachPlan]:
    """The attach variants to try, best first, for ``attach`` = auto | fentry | kprobe."""
    functions = [
        f for f in _HOOK_FUNCTIONS[hook] if f not in _OPTIONAL_FUNCTIONS or kernel_has(f, kallsyms)
    ]
    module = "drm" if hook == "drm_ioctl" and (btf_dir / "drm").exists() else "vmlinux"
    if module == "drm":
        fentry = AttachPlan(
            "fentry-module",
            tuple(
                Program(f, f"MODULE_KFUNC_PROBE(drm, {f}, {_ARGS})", f"kfunc__drm__{f}")
                for f in functions
            ),
        )
    else:
        fentry = AttachPlan(
            "fentry",
            tuple(
                Program(f, f"KFUNC_PROBE({f}, {_ARGS})", f"kfunc__vmlinux__{f}") for f in functions
            ),
        )
    kprobe = AttachPlan(
        "kprobe",
        tuple(
            Program(
                f, f"int kubenpu_kprobe_{f}(struct pt_regs *ctx, {_ARGS})", f"kubenpu_kprobe_{f}"
            )
            for f in functions
        ),
    )
    return {"auto": [fentry, kprobe], "fentry": [fentry], "kprobe": [kprobe]}[attach]


def vendor_ids() -> dict[str, int]:
    """BPF vendor ids: 0 is the DRM core table, plug-ins are numbered from 1."""
    ids = {core().name: 0}
    ids.update({v.name: i for i, v in enumerate(all_vendors(), start=1)})
    return ids


def source_text(plan: AttachPlan, ringbuf_pages: int, counts_entries: int) -> str:
    path = next((p for p in _SOURCE_CANDIDATES if p.exists()), None)
    if path is None:
        raise ProbeError("bpf/kubenpu.bpf.c is missing from the installation")
    # The probe (the attach line and its body, up to the first closing brace at the start of a
    # line) is repeated, one copy per hooked function.
    head, _, rest = path.read_text().partition("KUBENPU_ATTACH")
    body, end, tail = rest.partition("\n}\n")
    text = head + "".join(p.header + body + end for p in plan.programs) + tail
    return text.replace("RINGBUF_PAGES", str(ringbuf_pages)).replace(
        "COUNTS_ENTRIES", str(counts_entries)
    )


def _headers_hint() -> str:
    build = Path("/lib/modules") / os.uname().release / "build"
    if build.exists() or Path("/sys/kernel/kheaders.tar.xz").exists():
        return ""
    return (
        f"; kernel headers for {os.uname().release} not found: mount /lib/modules and /usr/src "
        "read-only from the node, or load the kheaders module"
    )


# What each hook needs (measured by tests/test_least_privilege_vm.py): fentry on a module function
# needs the module's BTF object, which the kernel hands out only to CAP_SYS_ADMIN; fentry on a
# vmlinux function needs CAP_BPF (maps, BTF) and CAP_PERFMON (tracing programs).
HOOK_CAPABILITIES = {"drm_ioctl": ("SYS_ADMIN",), "security_file_ioctl": ("BPF", "PERFMON")}
_CAP_BITS = {"SYS_ADMIN": 21, "PERFMON": 38, "BPF": 39}  # include/uapi/linux/capability.h


def effective_capabilities(status: Path = Path("/proc/self/status")) -> set[str]:
    """The capabilities of HOOK_CAPABILITIES that this process holds."""
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            mask = int(line.split()[1], 16)
            return {name for name, bit in _CAP_BITS.items() if mask >> bit & 1}
    return set()


def privileges_hint(hook: str, held: set[str]) -> str:
    """Names the capabilities the hook needs and the agent lacks (BCC's own message for a
    refusal varies: a map, the BTF or the program may be the first thing refused)."""
    missing = [c for c in HOOK_CAPABILITIES[hook] if c not in held and "SYS_ADMIN" not in held]
    if not missing:
        return ""
    names = ", ".join(f"CAP_{c}" for c in missing)
    need = " + ".join(f"CAP_{c}" for c in HOOK_CAPABILITIES[hook])
    return f"; missing {names}: probe.hook {hook} needs {need} (see docs/deploy.md)"


class CountKey(ctypes.Structure):
    """The C `struct count_key` of bpf/kubenpu.bpf.c."""

    _fields_ = [
        ("cgroup_id", ctypes.c_uint64),
        ("rdev", ctypes.c_uint32),
        ("kind", ctypes.c_uint32),
    ]


class CountsReader:
    """Reads the per-CPU counts map (by fd) with BPF_MAP_LOOKUP_BATCH into buffers allocated
    once: _BATCH keys a syscall, where BCC's items() costs two syscalls and several ctypes
    objects per key."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._ncpus = bpfsys.possible_cpus()
        self._keys = (CountKey * _BATCH)()
        self._values = (ctypes.c_uint64 * (_BATCH * self._ncpus))()  # one u64 per CPU per key

    def read(self) -> dict[Key, int]:
        found: dict[Key, int] = {}
        token_in, token_out = ctypes.c_uint32(0), ctypes.c_uint32(0)
        first = True
        while True:
            count = ctypes.c_uint32(_BATCH)
            try:
                more = bpfsys.lookup_batch(
                    self._fd,
                    None if first else token_in,
                    token_out,
                    self._keys,
                    self._values,
                    count,
                )
            except bpfsys.BpfError as err:
                raise ProbeError(f"reading the counts map failed: {err}") from err
            self._decode(count.value, found)
            if not more or count.value == 0:
                return found
            token_in.value, first = token_out.value, False

    def _decode(self, n: int, into: dict[Key, int]) -> None:
        ncpus, values = self._ncpus, self._values
        for i in range(n):
            k = self._keys[i]
            total = sum(values[i * ncpus : (i + 1) * ncpus])
            into[Key(k.cgroup_id, *split_dev_t(k.rdev), k.kind)] = total


def tables(devices: Iterable[Device]) -> tuple[dict[int, int], dict[tuple[int, int], int]]:
    """The contents of the `devices` (dev_t -> vendor id) and `ioctls` ({vendor id, nr} ->
    kind) maps for the counted devices."""
    ids = vendor_ids()
    devices = [d for d in devices if d.vendor]
    by_node = {node.dev_t: ids[d.vendor] for d in devices for node in d.nodes}
    names = {d.vendor for d in devices}
    vendors = (core(), *(v for v in all_vendors() if v.name in names))
    ioctls = {(ids[v.name], i.nr): int(i.kind) for v in vendors for i in v.ioctls}
    return by_node, ioctls


# The tp_btf program of bpf/kubenpu.bpf.c and the kernel ABI values it is loaded with.
_BIRTH_FN = b"kubenpu_cgroup_mkdir"
_BPF_PROG_TYPE_TRACING = 26
_BPF_TRACE_RAW_TP = 23


class _ProgLoadOpts(ctypes.Structure):
    """libbpf's struct bpf_prog_load_opts up to log_buf (libbpf reads only the first `sz` bytes)."""

    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("attempts", ctypes.c_int),
        ("expected_attach_type", ctypes.c_uint32),
        ("prog_btf_fd", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_ifindex", ctypes.c_uint32),
        ("kern_version", ctypes.c_uint32),
        ("attach_btf_id", ctypes.c_uint32),
        ("attach_prog_fd", ctypes.c_uint32),
        ("attach_btf_obj_fd", ctypes.c_uint32),
        ("fd_array", ctypes.c_void_p),
        ("func_info", ctypes.c_void_p),
        ("func_info_cnt", ctypes.c_uint32),
        ("func_info_rec_size", ctypes.c_uint32),
        ("line_info", ctypes.c_void_p),
        ("line_info_cnt", ctypes.c_uint32),
        ("line_info_rec_size", ctypes.c_uint32),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_void_p),
    ]


def attach_tp_btf(insns: bytes, tracepoint: str) -> tuple[int, int]:
    """Load BCC-compiled instructions as a tp_btf program and attach it; returns (prog, link) fds.

    BCC picks a program's attach type from its name prefix and has none for tp_btf, so this goes
    through libbpf (which BCC itself links against) for the BTF id, the load and the attach.
    """
    libbpf = bpfsys.libbpf()
    libbpf.bpf_prog_load.argtypes = [
        ctypes.c_uint, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
        ctypes.POINTER(_ProgLoadOpts),
    ]  # fmt: skip
    btf_id = libbpf.libbpf_find_vmlinux_btf_id(tracepoint.encode(), _BPF_TRACE_RAW_TP)
    if btf_id < 0:
        raise ProbeError(f"tracepoint {tracepoint} has no BTF: {os.strerror(-btf_id)}")
    log_buf = ctypes.create_string_buffer(1 << 16)
    opts = _ProgLoadOpts(
        sz=ctypes.sizeof(_ProgLoadOpts),
        expected_attach_type=_BPF_TRACE_RAW_TP,
        attach_btf_id=btf_id,
        log_size=len(log_buf),
        log_buf=ctypes.addressof(log_buf),
    )
    prog = libbpf.bpf_prog_load(
        _BPF_PROG_TYPE_TRACING, b"kubenpu_births", b"GPL", insns, len(insns) // 8, opts
    )
    if prog < 0:  # libbpf retried with the verifier log on, whose last line says why
        lines = log_buf.value.decode(errors="replace").strip().splitlines()
        raise ProbeError(f"loading tp_btf/{tracepoint}: {os.strerror(-prog)}: {lines[-1:]}")
    link = libbpf.bpf_raw_tracepoint_open(None, prog)
    if link < 0:
        os.close(prog)
        raise ProbeError(f"attaching tp_btf/{tracepoint}: {os.strerror(-link)}")
    return prog, link


class Kernel(Protocol):
    """The loaded BPF program as the Probe uses it; tests/fakes.py has a fake one."""

    aggregate: bool  # compiled for probe mode `aggregate` (else `events`)

    def start(self, on_record: Callable[[bytes], None]) -> str:
        """Load and attach, deliver ring-buffer records to on_record; returns the attach."""
        ...

    def poll(self, timeout_ms: int) -> None: ...

    def read_lost(self) -> dict[str, int]:
        """The `lost` array, cumulative, by KERNEL_LOST name. Raises ProbeError or OSError."""
        ...

    def read_counts(self) -> dict[Key, int]:
        """Aggregate mode's counts map, cumulative. Raises ProbeError or OSError."""
        ...

    def forget_counts(self, keys: Iterable[Key]) -> None: ...

    def close(self) -> None: ...


class BccKernel:
    """One BPF program loaded with BCC. poll() runs on one thread; the map reads and deletes
    (independent syscalls) on one other."""

    def __init__(
        self,
        devices: Iterable[Device],
        *,
        mode: str = "aggregate",
        hook: str = "drm_ioctl",
        attach: str = "auto",
        ringbuf_pages: int = 256,
        counts_entries: int = 16384,
        debug: bool = False,
    ) -> None:
        self._devices = [d for d in devices if d.vendor]
        self.before_attach: Callable[[], None] | None = None  # runs once the maps are filled
        # False: attach with the gate closed, counting nothing until a hand-over opens it
        # (docs/pinning.md); True: count from the attach on.
        self.gate_open = True
        self.aggregate = mode == "aggregate"
        self.hook = hook
        self._attach = attach
        self._ringbuf_pages = ringbuf_pages
        self._counts_entries = counts_entries
        self._debug = debug
        self._bpf = None
        self._plan: AttachPlan | None = None
        self._reader: CountsReader | None = None
        self._birth_fds: tuple[int, ...] = ()  # the cgroup_mkdir program and its link

    def start(self, on_record: Callable[[bytes], None]) -> str:
        errors = []
        for plan in attach_plans(self._attach, self.hook):
            try:
                self._bpf = self._load(plan)
                self._plan = plan
            except Exception as exc:  # BCC raises bare Exception for compile/load failures
                errors.append(f"{plan.attach}: {str(exc).splitlines()[0] if str(exc) else exc!r}")
                log.warning("attach %s unavailable: %s", plan.attach, errors[-1])
                continue
            if plan.attach == "kprobe":
                log.warning(
                    "fentry is unavailable; using the kprobe fallback (fails under lockdown)"
                )
            self._attach_births()
            self._open_ring_buffer(on_record)
            functions = [p.function for p in plan.programs]
            return (
                plan.attach
                if functions == [self.hook]
                else f"{plan.attach} on {'+'.join(functions)}"
            )
        hints = _headers_hint() + privileges_hint(self.hook, effective_capabilities())
        raise ProbeError(f"cannot attach to {self.hook}: " + "; ".join(errors) + hints)

    def _load(self, plan: AttachPlan):  # returns bcc.BPF
        import bcc  # deferred: BCC comes from the distribution and is only needed here

        class _Deferred(bcc.BPF):
            # BCC attaches kfunc__/kprobe__ functions while compiling; we attach only once
            # the maps are filled.
            def _trace_autoload(self) -> None:
                pass

        flags = bcc.DEBUG_BPF_REGISTER_STATE if self._debug else 0
        text = source_text(plan, self._ringbuf_pages, self._counts_entries)
        bpf = _Deferred(text=text, cflags=self._cflags(), debug=flags)
        self._fill_maps(bpf)
        if self.before_attach is not None:
            self.before_attach()
        for program in plan.programs:
            if plan.attach == "kprobe":
                bpf.attach_kprobe(event=program.function, fn_name=program.fn_name)
            else:
                bpf.attach_kfunc(fn_name=program.fn_name)
        return bpf

    def digest(self) -> str:
        """sha256 of what this kernel compiles: every attach variant's substituted source and
        the cflags; equal digests mean the same program."""
        h = hashlib.sha256()
        for plan in attach_plans(self._attach, self.hook):
            h.update(source_text(plan, self._ringbuf_pages, self._counts_entries).encode())
        h.update(" ".join(self._cflags()).encode())
        return h.hexdigest()

    def _attach_births(self) -> None:
        """Report new cgroups (16-byte records on the same ring buffer); optional: without it a
        cgroup removed before the next walk of the cgroup tree is not attributed."""
        try:
            self._birth_fds = attach_tp_btf(self._bpf.dump_func(_BIRTH_FN), "cgroup_mkdir")
        except (ProbeError, OSError) as err:
            log.warning(
                "cgroup births unavailable (%s): short-lived containers may lose their pod", err
            )

    def _cflags(self) -> list[str]:
        return [*_DIALECT_CFLAGS, *(["-DKUBENPU_AGGREGATE"] if self.aggregate else [])]

    def objects(self) -> dict[str, int]:
        """fds of what can be pinned, by pin name: the maps and, for an fentry attach, the
        bpf_link of each hooked function (`link-<function>`) and of the births program
        (`link-cgroup_mkdir`). A kprobe attach is a perf event, which bpffs cannot pin: then
        there is no `link-` of the hook's."""
        names = ("devices", "ioctls", "lost", "events", "gate", "counts")
        fds = {n: self._bpf[n].map_fd for n in names if n != "counts" or self.aggregate}
        if self._plan is not None and self._plan.attach != "kprobe":
            links = self._bpf.kfunc_entry_fds  # BCC's attach_kfunc: tracing bpf_links by name
            for program in self._plan.programs:
                fds[f"{LINK}{program.function}"] = links[program.fn_name.encode()]
        if self._birth_fds:
            fds[f"{LINK}cgroup_mkdir"] = self._birth_fds[1]
        return fds

    def _fill_maps(self, bpf) -> None:
        by_node, ioctl_kinds = tables(self._devices)
        devices = bpf["devices"]
        for rdev, vendor in by_node.items():
            devices[devices.Key(rdev)] = devices.Leaf(vendor)
        ioctls = bpf["ioctls"]
        for (vendor, nr), kind in ioctl_kinds.items():
            ioctls[ioctls.Key(vendor, nr)] = ioctls.Leaf(kind)
        gate = bpf["gate"]
        gate[gate.Key(0)] = gate.Leaf(GATE_OPEN if self.gate_open else GATE_CLOSED)

    def _open_ring_buffer(self, on_record: Callable[[bytes], None]) -> None:
        def callback(_ctx, data, size) -> int:
            on_record(ctypes.string_at(data, size))
            return 0

        self._callback = callback  # BCC keeps only a weak reference
        self._bpf["events"].open_ring_buffer(callback)

    def poll(self, timeout_ms: int) -> None:
        self._bpf.ring_buffer_poll(timeout_ms)

    def read_lost(self) -> dict[str, int]:
        table = self._bpf["lost"]
        return {name: int(sum(table[table.Key(i)])) for i, name in enumerate(KERNEL_LOST)}

    def read_counts(self) -> dict[Key, int]:
        if self._reader is None:
            self._reader = CountsReader(self._bpf["counts"].map_fd)
        return self._reader.read()

    def forget_counts(self, keys: Iterable[Key]) -> None:
        table = self._bpf["counts"]
        for key in keys:
            ck = table.Key(key.cgroup_id, dev_t(key.major, key.minor), key.kind)
            with contextlib.suppress(KeyError):
                del table[ck]

    def close(self) -> None:
        for fd in self._birth_fds:
            os.close(fd)
        self._birth_fds = ()
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None


class Probe:
    """Feeds a Tally with what the kernel counted, in the kernel's probe mode.

    - ``aggregate``: ring-buffer records are first sightings; `read()` turns the counts map into
      increments.
    - ``events``: each ring-buffer record is one call; there is no map to read.
    In both modes `read()` turns the kernel's `lost` counters into increments. A record that
    cannot be decoded is skipped and counted as a `bad_record` drop. Birth records (a new cgroup,
    both modes) go to `on_birth` at once, on the polling thread.
    """

    def __init__(
        self, kernel: Kernel, tally: Tally, on_birth: Callable[[Birth], None] | None = None
    ) -> None:
        self._kernel = kernel
        self._tally = tally
        self._on_birth = on_birth
        self._aggregate = kernel.aggregate
        self.mode = "aggregate" if kernel.aggregate else "events"
        self._counts: Deltas[Key] = Deltas()
        self._lost: Deltas[str] = Deltas()
        self._bad_records = 0

    def start(self) -> str:
        """Load and attach the program; returns the attach used. Raises ProbeError."""
        return self._kernel.start(self._on_record)

    def _on_record(self, data: bytes) -> None:
        # Runs inside BCC's ctypes callback, where an exception would only be printed.
        try:
            if (born := birth(data)) is not None:
                if self._on_birth is not None:
                    self._on_birth(born)
            elif self._aggregate:
                self._tally.add_sighting(data)
            else:
                self._tally.add_event(data)
        except Exception as exc:
            self._tally.drop(Drop.BAD_RECORD)
            self._bad_records += 1
            if self._bad_records == 1 or not isinstance(exc, BadRecord):
                log.warning("ring-buffer record skipped (counted as bad_record): %s", exc)

    def poll(self, timeout_ms: int) -> None:
        """Deliver pending records to the Tally, waiting up to timeout_ms for the first."""
        self._kernel.poll(timeout_ms)

    def read(self, counts: bool = True) -> None:
        """Add the kernel counters' increments to the Tally; the counts map only if `counts`.
        Raises ProbeError or OSError; nothing is lost then, the next read has the totals."""
        self._tally.kernel_lost(self._lost.step(self._kernel.read_lost()))
        if self._aggregate and counts:
            self._tally.add_counts(self._counts.step(self._kernel.read_counts()))

    def forget(self, keys: list[Key]) -> None:
        """Free the kernel entries of cgroups that are gone (no process can add to them)."""
        if self._aggregate:
            self._kernel.forget_counts(keys)
            self._counts.forget(keys)

    def close(self) -> None:
        self._kernel.close()
