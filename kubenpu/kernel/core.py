"""The CO-RE loader (`probe.loader: core`, and first under `auto`): open the object that `make
bpf` compiled ahead of time from bpf/kubenpu.bpf.c, size its maps, fill them, and attach the
hook's fentry programs, the exit that times calls (fexit, or a kretprobe on drm_ioctl) and the
cgroup_mkdir births program, all with the system libbpf through ctypes. libbpf relocates the
program's field reads against the running kernel's BTF (/sys/kernel/btf/vmlinux), so the node
needs neither kernel headers nor LLVM; docs/core.md.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import functools
import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from kubenpu.discovery import Device
from kubenpu.kernel import abi, bpfsys, hooks
from kubenpu.kernel.base import LoaderBase
from kubenpu.kernel.errors import Cause, ProbeError

log = logging.getLogger(__name__)

_LIBBPF_WARN = 0  # enum libbpf_print_level: WARN, INFO, DEBUG
_PRINT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_MESSAGE = 1 << 16  # room for a verifier log, whose last line says why a program was refused
_P, _INT = ctypes.c_void_p, ctypes.c_int
# The libbpf calls the loader makes: (name, result, arguments).
_CALLS = (
    ("bpf_object__open_file", _P, [ctypes.c_char_p, _P]),
    ("bpf_object__find_map_by_name", _P, [_P, ctypes.c_char_p]),
    ("bpf_object__find_program_by_name", _P, [_P, ctypes.c_char_p]),
    ("bpf_object__next_program", _P, [_P, _P]),
    ("bpf_object__load", _INT, [_P]),
    ("bpf_object__close", None, [_P]),
    ("bpf_map__set_max_entries", _INT, [_P, ctypes.c_uint32]),
    ("bpf_map__fd", _INT, [_P]),
    ("bpf_map__attach_struct_ops", _P, [_P]),
    ("bpf_program__name", ctypes.c_char_p, [_P]),
    ("bpf_program__set_autoload", _INT, [_P, ctypes.c_bool]),
    ("bpf_program__attach", _P, [_P]),
    ("bpf_link__fd", _INT, [_P]),
    ("bpf_link__destroy", _INT, [_P]),
    ("libbpf_set_print", _P, [_PRINT]),
)
# libbpf's own words for a kernel without BTF (btf__load_vmlinux_btf).
_NO_BTF = "failed to find valid kernel BTF"
_NO_BTF_CAUSE = "the kernel has no BTF (CONFIG_DEBUG_INFO_BTF, /sys/kernel/btf/vmlinux)"
_NO_BTF_HINT = (
    "; without BTF only BCC's kprobe attach works, with the node's kernel headers "
    "(chart value bccFallback: true, probe.attach: kprobe)"
)
_EPERM = bpfsys.error_name(errno.EPERM)
# The libbpf codes of an object file it cannot read as a BPF object.
_CORRUPT = {4000, 4001, 4002, 4003}  # LIBBPF_ERRNO__LIBELF, __FORMAT, __KVERSION, __ENDIAN
_libc = ctypes.CDLL(None)


class _OpenOpts(ctypes.Structure):
    """struct bpf_object_open_opts up to btf_custom_path (libbpf 0.5 on); libbpf reads `sz`
    and takes the fields past it as unset."""

    _fields_ = (
        ("sz", ctypes.c_size_t),
        ("object_name", ctypes.c_char_p),
        ("relaxed_maps", ctypes.c_bool),
        ("pin_root_path", ctypes.c_char_p),
        ("attach_prog_fd", ctypes.c_uint32),  # removed in 1.0: a zero stub keeps its place
        ("kconfig", ctypes.c_char_p),
        ("btf_custom_path", ctypes.c_char_p),
    )


_libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]


_KRETPROBES = set(abi.DRM_RETURN.values())  # the exits that are kretprobes, named so in the log
# What refuses a kretprobe to CAP_PERFMON (the first seen on Debian's 6.12: EACCES).
_KRETPROBE_REFUSED = (
    "; perf_event_paranoid 3 and more (Debian's, Ubuntu's) refuse perf events without "
    "CAP_SYS_ADMIN, and lockdown=confidentiality kprobes; probe.durations_exit: syscall times them"
)
OBJECTS = Path(__file__).parent / "objects"  # make bpf's output, in the wheel when built


def object_path(aggregate: bool) -> Path:
    """The built object of a probe mode (make bpf)."""
    return OBJECTS / f"kubenpu-{'aggregate' if aggregate else 'events'}.bpf.o"


@functools.cache
def shared_libbpf() -> _Libbpf:
    """One per process: libbpf's print callback is process-wide and must outlive every object."""
    return _Libbpf()


class _Libbpf:
    """The few libbpf calls the loader makes, typed once; libbpf's own messages are kept (the
    last warnings say why a load failed) instead of printed."""

    def __init__(self) -> None:
        try:
            lib = bpfsys.libbpf(tuple(name for name, _, _ in _CALLS))
        except bpfsys.MissingSymbols as err:
            raise ProbeError(
                f"{err}, which the CO-RE loader calls (libbpf 1.0 and later have them)",
                Cause.OLD_LIBBPF,
            ) from err
        except OSError as err:
            raise ProbeError(
                f"libbpf (libbpf.so.1) is needed for the CO-RE object: {err}", Cause.NO_LIBBPF
            ) from err
        for name, res, args in _CALLS:
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self.lib = lib
        self.messages: collections.deque[str] = collections.deque(maxlen=20)
        self._print = _PRINT(self._on_print)  # kept: libbpf holds only the pointer
        lib.libbpf_set_print(self._print)

    def _on_print(self, level: int, fmt: bytes, args: int) -> int:
        if level != _LIBBPF_WARN and not log.isEnabledFor(logging.DEBUG):
            return 0  # ~300 lines per load, formatted for nothing: 0.3 s of a start under TCG
        buf = ctypes.create_string_buffer(_MESSAGE)
        _libc.vsnprintf(buf, len(buf), fmt, args)
        line = buf.value.decode(errors="replace").strip()
        if line:
            log.debug("%s", line)
            if level == _LIBBPF_WARN:
                self.messages.append(line)
        return 0

    def why(self, err: int) -> str:
        """One line: libbpf's reason, then the code's name. The first warning since the call is
        the reason (those after it say what failed because of it); a refused program's verifier
        log adds its last line."""
        reason = self.messages[0].splitlines()[0] if self.messages else ""
        verifier = next((m for m in self.messages if "BEGIN PROG LOAD LOG" in m), "")
        said = [  # its last line counts instructions; the one before it says why
            line
            for line in verifier.splitlines()[1:]
            if "PROG LOAD LOG" not in line and not line.startswith("processed ")
        ]
        reason += f": {said[-1].strip()}" if said else ""
        return f"{reason} ({bpfsys.error_name(err)})" if reason else bpfsys.error_name(err)

    def says(self, words: str) -> bool:
        return any(words in m for m in self.messages)

    # The object calls both loaders make (this one's and kubenpu.kernel.jobs'), each failure a
    # ProbeError with libbpf's reason.

    def open(self, path: Path, btf: Path | None = None) -> int:
        """The struct bpf_object * of an object file, opened (not loaded); `btf`: the BTF its
        CO-RE reads relocate against, instead of the kernel's (kubenpu.kernel.btf)."""
        opts = _OpenOpts(ctypes.sizeof(_OpenOpts), btf_custom_path=btf and os.fsencode(btf))
        obj = self.lib.bpf_object__open_file(os.fsencode(path), ctypes.addressof(opts))
        if not obj:
            err = ctypes.get_errno()
            cause = Cause.OBJECT_CORRUPT if err in _CORRUPT else Cause.OTHER
            raise ProbeError(f"opening {path}: {self.why(err)}", cause)
        return obj

    def load(self, obj: int, wanted: set[str], what: str) -> None:
        """Load `obj` with only the programs named in `wanted` (`what` names it in an error)."""
        prog = self.lib.bpf_object__next_program(obj, None)
        while prog:
            self.lib.bpf_program__set_autoload(
                prog, self.lib.bpf_program__name(prog).decode() in wanted
            )
            prog = self.lib.bpf_object__next_program(obj, prog)
        if (err := self.lib.bpf_object__load(obj)) < 0:
            raise ProbeError(f"loading {what}: {self.why(err)}")

    def find_map(self, obj: int, name: str) -> int:
        found = self.lib.bpf_object__find_map_by_name(obj, name.encode())
        if not found:
            raise ProbeError(f"the object has no map {name}")
        return found

    def unload(self, links: Iterable[int], obj: int | None) -> None:
        """Destroy `links` (a pinned one stays attached: the pin holds it), then close `obj`."""
        for link in links:
            self.lib.bpf_link__destroy(link)
        if obj:
            self.lib.bpf_object__close(obj)

    def attach_struct_ops(self, obj: int, name: str) -> int:
        """The struct bpf_link * of the struct_ops map `name`, registered with the kernel (for
        sched_ext: the scheduler enabled). Destroying the link unregisters it."""
        link = self.lib.bpf_map__attach_struct_ops(self.find_map(obj, name))
        if not link:
            raise ProbeError(f"attaching {name}: {self.why(ctypes.get_errno())}")
        return link

    def attach(self, obj: int, name: str) -> int:
        """The struct bpf_link * of the program `name`, attached."""
        prog = self.lib.bpf_object__find_program_by_name(obj, name.encode())
        link = self.lib.bpf_program__attach(prog) if prog else None
        if not link:
            raise ProbeError(f"attaching {name}: {self.why(ctypes.get_errno())}")
        return link


def timing(timed: list[str], untimed: str) -> str:
    """Which calls are timed, the line the start logs (kubenpuctl latency points there)."""
    if timed:
        return f"counted calls timed at the exit of {'+'.join(timed)}"
    return f"counted calls untimed ({untimed or 'no exit attached'})"


class CoreKernel(LoaderBase):
    """The probe loaded from the CO-RE object. poll() runs on one thread; the map reads and
    deletes on one other."""

    loader = "core"
    times_calls = True

    def __init__(
        self,
        devices: Iterable[Device],
        *,
        path: Path | None = None,
        alone: bool = False,
        durations: bool = True,
        durations_exit: str = "drm_ioctl",
        **settings,
    ) -> None:
        super().__init__(devices, **settings)
        self._path = path
        self._durations = durations  # attach an exit (probe.durations)
        self._durations_exit = durations_exit  # which one, on the LSM hook (probe.durations_exit)
        self._alone = alone  # no BCC fallback after it: a kernel without BTF says how to allow one
        self._lib: _Libbpf | None = None
        self._obj: int | None = None
        self._links: dict[str, int] = {}  # pin name -> struct bpf_link *

    def _object(self) -> Path:
        path = self._path or object_path(self.aggregate)
        if not path.exists():
            raise ProbeError(
                f"the CO-RE object {path} is missing (build it with `make bpf`)",
                Cause.OBJECT_MISSING,
            )
        return path

    def digest(self) -> str:
        """sha256 of the object and its sizes; equal digests mean the same program. A missing
        object has a digest too: its start() says what is missing."""
        path = self._path or object_path(self.aggregate)
        h = hashlib.sha256(path.read_bytes() if path.exists() else os.fsencode(path))
        timing = f"{self._durations} {self._durations_exit}"
        h.update(f"{self._ringbuf_pages} {self._counts_entries} {timing}".encode())
        return h.hexdigest()

    def start(self, on_record: Callable[[bytes], None]) -> str:
        if self._attach == "kprobe":
            raise ProbeError("the CO-RE object has fentry programs only (probe.attach: kprobe)")
        wanted, untimed = self._exits()
        # One pass over kallsyms; drm_ioctl is in drm.ko, whose symbols come last.
        present = hooks.kernel_symbols(
            hooks.optional_functions(self.hook) | set(wanted) - {"drm_ioctl"}
        )
        functions = hooks.functions(self.hook, present)
        exits = {f: p for f, p in wanted.items() if f == "drm_ioctl" or f in present}
        if wanted and not exits:
            untimed = f"the kernel has none of {', '.join(wanted)}"
            log.warning("call durations unavailable: %s", untimed)
        try:
            self._lib = shared_libbpf()
            self._lib.messages.clear()
            self._load(functions, exits)
            timed = self._attach_all(functions, exits)
            self._open_ring(on_record)
        except (ProbeError, bpfsys.BpfError) as err:
            self.close()
            raise self._failure(err) from err
        attach = "fentry-module" if hooks.in_module(self.hook) else "fentry"
        if self.aggregate:
            log.info("%s", timing(timed, untimed))
        return hooks.describe(attach, functions, self.loader)

    def _failure(self, err: ProbeError | bpfsys.BpfError) -> ProbeError:
        """A failed start's line, its cause first: missing capabilities, a kernel or drm.ko
        without BTF, EPERM with every capability held (hooks.refusal), else what failed. Alone
        (`probe.loader: core`) it names BCC only where that is the way out: a kernel without
        BTF, where BCC's kprobe attach works with kernel headers."""
        head = f"cannot attach to {self.hook}: core: "
        cause = getattr(err, "cause", Cause.OTHER)  # the object's and libbpf's own come first
        if cause is not Cause.OTHER:
            return ProbeError(f"{head}{err}", cause)
        if missing := hooks.missing_privileges(self.hook, hooks.effective_capabilities()):
            return ProbeError(f"{head}{missing}: {err}", Cause.CAPABILITIES)
        if no_btf := hooks.module_without_btf(self.hook):
            return ProbeError(f"{head}{no_btf}: {err}", Cause.NO_BTF)
        if self._lib is not None and self._lib.says(_NO_BTF):
            hint = _NO_BTF_HINT if self._alone else ""
            return ProbeError(f"{head}{_NO_BTF_CAUSE}: {err}{hint}", Cause.NO_BTF)
        if _EPERM in str(err):  # with every capability held: not the capabilities
            return ProbeError(f"{head}{hooks.refusal(self.hook)}: {err}", Cause.REFUSED)
        return ProbeError(f"{head}{err}", cause)

    def _load(self, functions: list[str], exits: dict[str, str]) -> None:
        lib = self._lib.lib
        self._obj = self._lib.open(self._object())
        shapes = self.shapes()
        self._map(abi.EVENTS, self._ringbuf_pages * abi.PAGE)
        for name in (abi.COUNTS, abi.DURATIONS):
            if name in shapes:
                self._map(name, shapes[name].max_entries)
        wanted = {abi.IOCTL_PROGRAMS[f] for f in functions} | {abi.BIRTHS}
        wanted |= set(exits.values())
        self._lib.load(self._obj, wanted, "the object")
        self._fill({n: lib.bpf_map__fd(self._map(n)) for n in shapes})

    def _exits(self) -> tuple[dict[str, str], str]:
        """The exit programs by function that this machine's kernels can have, and why there
        are none: none in events mode or with probe.durations off. On the LSM hook the default
        exit is drm_ioctl's, which DRM calls alone pass (every other ioctl of the node pays no
        exit): fexit where its BTF is reachable (a trampoline, cheaper), else a kretprobe, which
        least privilege (no CAP_SYS_ADMIN for drm.ko's BTF) can attach. The syscall's return
        (probe.durations_exit: syscall) is every ioctl's."""
        if not self.aggregate:
            return {}, ""
        if not self._durations:
            return {}, "probe.durations: false"
        if self.hook == "drm_ioctl":
            return abi.EXIT_PROGRAMS["drm_ioctl"], ""
        if self._durations_exit == "syscall":
            return abi.exit_programs("syscall", os.uname().machine), ""
        reach = hooks.drm_exit(hooks.effective_capabilities())
        if not reach:
            return {}, "drm is not loaded; probe.durations_exit: syscall times them"
        return abi.EXIT_PROGRAMS["drm_ioctl"] if reach == "fexit" else abi.DRM_RETURN, ""

    def _map(self, name: str, max_entries: int | None = None) -> int:
        found = self._lib.find_map(self._obj, name)
        if (
            max_entries is not None
            and self._lib.lib.bpf_map__set_max_entries(found, max_entries) < 0
        ):
            raise ProbeError(f"sizing the map {name} to {max_entries}")
        return found

    def _attach_all(self, functions: list[str], exits: dict[str, str]) -> list[str]:
        """Attach the exits, the entries and the births; the exits' functions attached."""
        if self.before_attach is not None:
            self.before_attach()
        # Exits first: a call that entered before its exit was attached would leave its start
        # for the task's next DRM ioctl to end, with a wrong duration.
        timed = self._attach_exits(exits)
        if abi.DURATIONS in self._maps.fds:
            self._maps.set_timing(bool(timed))  # no exit attached: the entry keeps no start
        for function in functions:
            self._links[f"{abi.LINK}{function}"] = self._attach_program(
                abi.IOCTL_PROGRAMS[function]
            )
        try:  # optional, as in the BCC loader
            self._links[f"{abi.LINK}{abi.BIRTHS_TRACEPOINT}"] = self._attach_program(abi.BIRTHS)
        except ProbeError as err:
            log.warning(
                "cgroup births unavailable (%s): short-lived containers may lose their pod", err
            )
        return timed

    def _attach_exits(self, exits: dict[str, str]) -> list[str]:
        """Optional: without an exit the calls are counted, not timed. The functions attached."""
        timed = []
        for function, program in exits.items():
            try:
                self._links[f"{abi.EXIT_LINK}{function}"] = self._attach_program(program)
                timed.append(f"{function} (kretprobe)" if program in _KRETPROBES else function)
            except ProbeError as err:
                why = _KRETPROBE_REFUSED if program in _KRETPROBES else ""
                log.warning("call durations unavailable from %s: %s%s", function, err, why)
        return timed

    def _attach_program(self, name: str) -> int:
        return self._lib.attach(self._obj, name)

    def objects(self) -> dict[str, int]:
        """fds of what can be pinned, by pin name: the maps and every program's bpf_link."""
        links = {name: self._lib.lib.bpf_link__fd(link) for name, link in self._links.items()}
        return {**self._maps.fds, **links}

    def close(self) -> None:
        """Detach (a pinned link stays attached: the pin holds it) and free the object."""
        self._close_ring()
        if self._lib is not None:  # None: libbpf never opened, nothing was loaded
            self._lib.unload(self._links.values(), self._obj)
        self._links.clear()
        self._obj = None
