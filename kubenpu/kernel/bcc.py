"""The BCC loader, the fallback (`probe.loader: bcc`, or `auto` when the kernel refuses the CO-RE
object): compile bpf/kubenpu.bpf.c on the node with BCC (which needs the node's kernel headers and
LLVM), fill its maps, attach it to the hook's functions.

Attach variants (`probe.attach`), tried in this order under ``attach: auto``:
- ``fentry-module``: MODULE_KFUNC_PROBE(drm, drm_ioctl) when DRM is a module (BCC >= 0.28);
- ``fentry``: KFUNC_PROBE on a vmlinux function (drm_ioctl when DRM is built in, or the LSM hook);
- ``kprobe``: the fallback where fentry is unavailable. It reads kernel memory through
  bpf_probe_read_kernel, which lockdown=confidentiality forbids.
The maps are filled before the program is attached, so every call after attach is judged
against the full device and ioctl tables.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from kubenpu.discovery import Device
from kubenpu.kernel import abi, bpfsys, hooks
from kubenpu.kernel.base import LoaderBase
from kubenpu.kernel.errors import Cause, ProbeError

log = logging.getLogger(__name__)

_ARGS = "struct file *filp, unsigned int cmd, unsigned long arg"
# The kernel's own C dialect flags (CC_FLAGS_DIALECT), which BCC 0.31 does not pass: from 6.19
# the headers embed tagged structs anonymously (struct filename in linux/fs.h), which clang only
# accepts with -fms-extensions. Older headers compile the same with them.
_DIALECT_CFLAGS = ("-fms-extensions", "-Wno-microsoft-anon-tag")
_BPF_DIRS = (
    Path(__file__).parents[1] / "bpf",  # installed wheel
    Path(__file__).parents[2] / "bpf",  # source tree / editable install
)
_INCLUDE = re.compile(r'^#include "([\w.]+)"$', re.M)
# A kprobe attach refused under lockdown=confidentiality: BCC turns its field reads into
# bpf_probe_read, which that level withholds (tests/test_e2e_vm.py, lockdown kernel).
_LOCKED_DOWN = (
    "kprobe: kernel lockdown (confidentiality) refuses the bpf_probe_read that BCC's kprobe "
    "attach reads fields with (probe.attach: fentry does without it): "
)
_TP_BTF = ("bpf_prog_load", "libbpf_find_vmlinux_btf_id", "bpf_raw_tracepoint_open")


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


def attach_plans(
    attach: str,
    hook: str = hooks.DEFAULT_HOOK,
    btf_dir: Path = Path("/sys/kernel/btf"),
    kallsyms: Path = Path("/proc/kallsyms"),
) -> list[AttachPlan]:
    """The attach variants to try, best first, for ``attach`` = auto | fentry | kprobe."""
    functions = hooks.functions(
        hook, hooks.kernel_symbols(hooks.optional_functions(hook), kallsyms)
    )
    if hooks.in_module(hook, btf_dir):
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


def bpf_dir() -> Path:
    """Where the C source (and the built CO-RE objects) are: the wheel's or the source tree's."""
    found = next((d for d in _BPF_DIRS if (d / "kubenpu.bpf.c").exists()), None)
    if found is None:
        raise ProbeError("bpf/kubenpu.bpf.c is missing from the installation")
    return found


def source_text(plan: AttachPlan) -> str:
    """The BCC text: the source with its local headers inlined (BCC rewrites map calls only in
    the main file), and the probe (the attach line and its body, up to the first closing brace
    at the start of a line) repeated, one copy per hooked function."""
    src = bpf_dir()
    text = (src / "kubenpu.bpf.c").read_text()
    while _INCLUDE.search(text):
        text = _INCLUDE.sub(lambda m: (src / m[1]).read_text(), text)
    head, _, rest = text.partition("KUBENPU_ATTACH")
    body, end, tail = rest.partition("\n}\n")
    return head + "".join(p.header + body + end for p in plan.programs) + tail


def headers_hint() -> str:
    """What to do when the kernel headers BCC compiles against are missing ("" when found)."""
    build = Path("/lib/modules") / os.uname().release / "build"
    if build.exists() or Path("/sys/kernel/kheaders.tar.xz").exists():
        return ""
    return (
        f"; kernel headers for {os.uname().release} not found: BCC compiles against them "
        "(chart value bccFallback: true mounts /lib/modules and /usr/src from the node)"
    )


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


_BPF_PROG_TYPE_TRACING = 26
_BPF_TRACE_RAW_TP = 23


def attach_tp_btf(insns: bytes, tracepoint: str) -> tuple[int, int]:
    """Load BCC-compiled instructions as a tp_btf program and attach it; returns (prog, link) fds.

    BCC picks a program's attach type from its name prefix and has none for tp_btf, so this goes
    through libbpf (which BCC itself links against) for the BTF id, the load and the attach.
    """
    libbpf = bpfsys.libbpf(_TP_BTF)
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


class BccKernel(LoaderBase):
    """One BPF program compiled and loaded with BCC. poll() runs on one thread; the map reads
    and deletes (independent syscalls) on one other."""

    loader = "bcc"

    def __init__(self, devices: Iterable[Device], *, debug: bool = False, **settings) -> None:
        super().__init__(devices, **settings)
        self._debug = debug
        self._bpf = None
        self._plan: AttachPlan | None = None
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
            return hooks.describe(plan.attach, [p.function for p in plan.programs], self.loader)
        raise self._failure(errors)

    def _failure(self, errors: list[str]) -> ProbeError:
        """A failed start's line, its cause first: missing capabilities (no headers would help),
        lockdown refusing the kprobe attach's reads, else what each attach said, and where the
        kernel headers are missing, how to mount them."""
        head = f"cannot attach to {self.hook}: "
        if missing := hooks.missing_privileges(self.hook, hooks.effective_capabilities()):
            return ProbeError(f"{head}{missing}: " + "; ".join(errors), Cause.CAPABILITIES)
        kprobe = "kprobe: "
        if hooks.lockdown() == "confidentiality" and any(e.startswith(kprobe) for e in errors):
            said = [_LOCKED_DOWN + e[len(kprobe) :] if e.startswith(kprobe) else e for e in errors]
            return ProbeError(head + "; ".join(said), Cause.LOCKDOWN)
        return ProbeError(head + "; ".join(errors) + headers_hint())

    def _load(self, plan: AttachPlan):  # returns bcc.BPF
        import bcc  # deferred: BCC comes from the distribution and is only needed here

        class _Deferred(bcc.BPF):
            # BCC attaches kfunc__/kprobe__ functions while compiling; we attach only once
            # the maps are filled.
            def _trace_autoload(self) -> None:
                pass

        flags = bcc.DEBUG_BPF_REGISTER_STATE if self._debug else 0
        bpf = _Deferred(text=source_text(plan), cflags=self._cflags(plan), debug=flags)
        self._fill(self._map_fds(bpf))
        if self.before_attach is not None:
            self.before_attach()
        for program in plan.programs:
            if plan.attach == "kprobe":
                bpf.attach_kprobe(event=program.function, fn_name=program.fn_name)
            else:
                bpf.attach_kfunc(fn_name=program.fn_name)
        return bpf

    def digest(self) -> str:
        """sha256 of what this kernel compiles: every attach variant's source and cflags; equal
        digests mean the same program."""
        h = hashlib.sha256()
        for plan in attach_plans(self._attach, self.hook):
            h.update(source_text(plan).encode())
            h.update(" ".join(self._cflags(plan)).encode())
        return h.hexdigest()

    def _attach_births(self) -> None:
        """Report new cgroups (16-byte records on the same ring buffer); optional: without it a
        cgroup removed before the next walk of the cgroup tree is not attributed."""
        try:
            insns = self._bpf.dump_func(abi.BIRTHS.encode())
            self._birth_fds = attach_tp_btf(insns, abi.BIRTHS_TRACEPOINT)
        except (ProbeError, OSError) as err:
            log.warning(
                "cgroup births unavailable (%s): short-lived containers may lose their pod", err
            )

    def _cflags(self, plan: AttachPlan) -> list[str]:
        return [
            *_DIALECT_CFLAGS,
            "-DKUBENPU_BCC",
            f"-DRINGBUF_PAGES={self._ringbuf_pages}",
            f"-DCOUNTS_ENTRIES={self._counts_entries}",
            *(["-DKUBENPU_AGGREGATE"] if self.aggregate else []),
            *(["-DKUBENPU_KPROBE"] if plan.attach == "kprobe" else []),
        ]

    def _map_fds(self, bpf) -> dict[str, int]:
        names = (*abi.MAPS, *([abi.COUNTS] if self.aggregate else []))
        return {n: bpf[n].map_fd for n in names}

    def objects(self) -> dict[str, int]:
        """fds of what can be pinned, by pin name: the maps and, for an fentry attach, the
        bpf_link of each hooked function (`link-<function>`) and of the births program
        (`link-cgroup_mkdir`). A kprobe attach is a perf event, which bpffs cannot pin: then
        there is no `link-` of the hook's."""
        fds = dict(self._map_fds(self._bpf))
        if self._plan is not None and self._plan.attach != "kprobe":
            links = self._bpf.kfunc_entry_fds  # BCC's attach_kfunc: tracing bpf_links by name
            for program in self._plan.programs:
                fds[f"{abi.LINK}{program.function}"] = links[program.fn_name.encode()]
        if self._birth_fds:
            fds[f"{abi.LINK}{abi.BIRTHS_TRACEPOINT}"] = self._birth_fds[1]
        return fds

    def _open_ring_buffer(self, on_record: Callable[[bytes], None]) -> None:
        def callback(_ctx, data, size) -> int:
            on_record(ctypes.string_at(data, size))
            return 0

        self._callback = callback  # BCC keeps only a weak reference
        self._bpf[abi.EVENTS].open_ring_buffer(callback)

    def poll(self, timeout_ms: int) -> None:
        self._bpf.ring_buffer_poll(timeout_ms)

    def close(self) -> None:
        for fd in self._birth_fds:
            os.close(fd)
        self._birth_fds = ()
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
