"""kubenpu/kernel/core.py's CoreKernel.start() on the real system libbpf and the real CO-RE
object (make bpf). Only what this host's kernel refuses is stood in for: the object's load
(EPERM here) hands the loader real maps of the object's own shapes made with bpf(2), and a
program's attach (no fentry here) records the program, in order, and hands out a link. The real
load and attach run in the VM (test_e2e_vm, test_least_privilege_vm)."""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kubenpu.kernel import abi, bpfsys, core, hooks
from kubenpu.kernel.core import CoreKernel
from kubenpu.kernel.errors import Cause, ProbeError

HOOK = "security_file_ioctl"
HOST_EXITS = {"__x64_sys_ioctl", "__ia32_compat_sys_ioctl"}  # an x86-64 kernel's
HOST_FUNCTIONS = HOST_EXITS | {HOOK, f"{HOOK}_compat"}  # a 6.8+ kernel, as the VM's
ENTRIES = [abi.IOCTL_PROGRAMS[HOOK], abi.IOCTL_PROGRAMS[f"{HOOK}_compat"]]
_OWN = ctypes.CDLL("libbpf.so.1")  # typed handles of our own: the loader's stay as they are
for _name, _res, _args in (
    ("bpf_map__name", ctypes.c_char_p, [ctypes.c_void_p]),
    ("bpf_program__name", ctypes.c_char_p, [ctypes.c_void_p]),
    ("bpf_program__autoload", ctypes.c_bool, [ctypes.c_void_p]),
    ("bpf_object__next_program", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]),
    ("bpf_map__type", ctypes.c_int, [ctypes.c_void_p]),
    ("bpf_map__key_size", ctypes.c_uint32, [ctypes.c_void_p]),
    ("bpf_map__value_size", ctypes.c_uint32, [ctypes.c_void_p]),
    ("bpf_map__max_entries", ctypes.c_uint32, [ctypes.c_void_p]),
):
    getattr(_OWN, _name).restype, getattr(_OWN, _name).argtypes = _res, _args


@dataclass
class Kernel:
    """What the host's kernel would have answered: the programs the load was asked for, the
    maps it made, the attaches in order, the links destroyed."""

    autoloaded: set[str] = field(default_factory=set)
    fds: dict[str, int] = field(default_factory=dict)
    attached: list[str] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)  # programs whose attach fails
    links: dict[int, str] = field(default_factory=dict)
    destroyed: list[str] = field(default_factory=list)
    asked: list[set[str]] = field(default_factory=list)  # each kallsyms pass: the names wanted

    def load(self, obj: int) -> int:
        prog = _OWN.bpf_object__next_program(obj, None)
        while prog:
            if _OWN.bpf_program__autoload(prog):
                self.autoloaded.add(_OWN.bpf_program__name(prog).decode())
            prog = _OWN.bpf_object__next_program(obj, prog)
        return 0

    closed: list[int] = field(default_factory=list)

    def map_fd(self, found: int) -> int:
        """The map as libbpf was told to make it (its type and sizes, after set_max_entries)."""
        name = _OWN.bpf_map__name(found).decode()
        shape = abi.MapShape(
            _OWN.bpf_map__type(found),
            _OWN.bpf_map__key_size(found),
            _OWN.bpf_map__value_size(found),
            _OWN.bpf_map__max_entries(found),
        )
        if name == abi.STARTS:  # task storage needs the program's BTF: a hash of its sizes
            shape = shape._replace(type=abi.MAP_TYPE_HASH, max_entries=1)
        if name not in self.fds:
            self.fds[name] = bpfsys.map_create(*shape, name)
        return self.fds[name]

    def attach(self, prog: int) -> int | None:
        name = _OWN.bpf_program__name(prog).decode()
        if name in self.refuse:
            ctypes.set_errno(95)  # EOPNOTSUPP
            return None
        self.attached.append(name)
        link = 0x1000 + len(self.links)
        self.links[link] = name
        return link

    def destroy(self, link: int) -> int:
        self.destroyed.append(self.links[link])
        return 0


@pytest.fixture
def kernel(monkeypatch) -> Iterator[Kernel]:
    if not core.object_path(True).exists():
        pytest.skip("make bpf has not built the CO-RE objects")
    fake = Kernel()
    lib = core.shared_libbpf().lib
    monkeypatch.setattr(lib, "bpf_object__load", fake.load)
    monkeypatch.setattr(lib, "bpf_map__fd", fake.map_fd)
    monkeypatch.setattr(lib, "bpf_program__attach", fake.attach)
    monkeypatch.setattr(lib, "bpf_link__fd", lambda link: 100 + link - 0x1000)
    monkeypatch.setattr(lib, "bpf_link__destroy", fake.destroy)
    close = lib.bpf_object__close
    monkeypatch.setattr(lib, "bpf_object__close", lambda obj: (fake.closed.append(obj), close(obj)))

    def kernel_symbols(wanted):
        fake.asked.append(set(wanted))
        return set(wanted) & HOST_FUNCTIONS

    monkeypatch.setattr(hooks, "kernel_symbols", kernel_symbols)
    yield fake
    for fd in fake.fds.values():
        os.close(fd)


def started(fake: Kernel, **settings) -> tuple[CoreKernel, str]:
    probe = CoreKernel([], **settings)
    return probe, probe.start(lambda _: None)


SYSCALL = {"durations_exit": "syscall"}  # every ioctl's exit, the LSM hook's opt-in


def test_it_loads_only_the_hooks_programs_and_attaches_the_exits_first(kernel, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=core.__name__):
        probe, said = started(kernel, **SYSCALL)
    assert caplog.records == []  # every exit and the births attached: nothing to warn of
    assert said == f"fentry on {HOOK}+{HOOK}_compat (core)"
    assert kernel.asked == [{f"{HOOK}_compat", *HOST_EXITS}]  # one pass over kallsyms, at start
    exits = ["kubenpu_sys_exit", "kubenpu_compat_exit"]
    assert kernel.autoloaded == {*ENTRIES, *exits, abi.BIRTHS}  # not the drm_ioctl hook's
    assert kernel.attached == [*exits, *ENTRIES, abi.BIRTHS]
    links = {name: fd for name, fd in probe.objects().items() if name.startswith(abi.LINK)}
    assert links == {
        f"{abi.EXIT_LINK}__x64_sys_ioctl": 100,
        f"{abi.EXIT_LINK}__ia32_compat_sys_ioctl": 101,
        f"{abi.LINK}{HOOK}": 102,
        f"{abi.LINK}{HOOK}_compat": 103,
        f"{abi.LINK}{abi.BIRTHS_TRACEPOINT}": 104,
    }
    maps = {name: fd for name, fd in probe.objects().items() if not name.startswith(abi.LINK)}
    assert maps == kernel.fds and set(maps) == set(probe.shapes())
    shapes = probe.shapes()
    assert {n: bpfsys.map_shape(fd) for n, fd in maps.items() if n != abi.STARTS} == {
        n: shape for n, shape in shapes.items() if n != abi.STARTS
    }  # what libbpf was told is what the pinned identity checks
    timed_open = abi.U32.pack(abi.GATE_OPEN | abi.GATE_TIMED)
    assert bpfsys.lookup(maps[abi.GATE], abi.U32.pack(0), 4) == timed_open
    obj = probe._obj
    probe.close()
    assert sorted(kernel.destroyed) == sorted(kernel.attached) and kernel.closed == [obj]
    probe.close()  # once: the links and the object are gone
    assert len(kernel.destroyed) == len(kernel.attached) and kernel.closed == [obj]


@pytest.mark.parametrize(
    ("drm", "module", "held", "exit", "line"),
    [
        # drm.ko's BTF: CAP_SYS_ADMIN looks it up, and fexit (a trampoline) is the cheaper exit
        (True, True, {"SYS_ADMIN"}, "kubenpu_drm_exit", "drm_ioctl"),
        # the chart's least privilege: a perf-event kretprobe needs no module BTF
        (True, True, {"BPF", "PERFMON"}, "kubenpu_drm_return", "drm_ioctl (kretprobe)"),
        (True, False, {"BPF", "PERFMON"}, "kubenpu_drm_exit", "drm_ioctl"),  # built in: vmlinux's
        (False, True, {"SYS_ADMIN"}, None, None),  # no drm loaded: nothing to time
    ],
)
def test_the_lsm_hook_times_calls_at_drm_ioctls_exit_where_it_can_reach_it(
    kernel, monkeypatch, tmp_path, caplog, drm, module, held, exit, line
) -> None:
    """By default only DRM calls pass an exit (drm_ioctl's): TCGETS and every other ioctl of
    the node pay the entry's type test alone. fexit where drm_ioctl's BTF is reachable, else a
    kretprobe (CAP_BPF + CAP_PERFMON); only the chosen one is loaded. Without drm calls are
    counted untimed, and the start says so in one line, with the setting that times them."""
    if drm:
        (tmp_path / "drm").mkdir()
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: held)
    monkeypatch.setattr(hooks, "in_module", lambda hook: module and hook == "drm_ioctl")
    reach = hooks.drm_exit
    monkeypatch.setattr(hooks, "drm_exit", lambda h: reach(h, tmp_path))
    with caplog.at_level(logging.INFO, logger=core.__name__):
        probe, said = started(kernel)
    assert said == f"fentry on {HOOK}+{HOOK}_compat (core)"
    assert kernel.asked == [{f"{HOOK}_compat"}]  # no syscall name: kallsyms ends sooner
    lines = [r.getMessage() for r in caplog.records]
    exits = {"kubenpu_drm_exit", "kubenpu_drm_return", "kubenpu_sys_exit", "kubenpu_compat_exit"}
    if exit:
        assert kernel.attached == [exit, *ENTRIES, abi.BIRTHS]
        assert lines == [f"counted calls timed at the exit of {line}"]
        links = {n for n in probe.objects() if n.startswith(abi.EXIT_LINK)}
        assert links == {f"{abi.EXIT_LINK}drm_ioctl"}
    else:
        assert kernel.attached == [*ENTRIES, abi.BIRTHS]
        assert lines == [
            "counted calls untimed (drm is not loaded; probe.durations_exit: syscall times them)"
        ]
    assert kernel.autoloaded & exits == ({exit} if exit else set())  # the chosen exit alone
    gate = bpfsys.lookup(kernel.fds[abi.GATE], abi.U32.pack(0), 4)
    # untimed, the entry keeps no start either
    assert gate == abi.U32.pack(abi.GATE_OPEN | (abi.GATE_TIMED if exit else 0))
    probe.close()


def test_a_refused_kretprobe_leaves_calls_untimed_and_starts_unkept(
    kernel, monkeypatch, tmp_path, caplog
) -> None:
    """Debian's perf_event_paranoid=3 refuses the kretprobe's perf event to CAP_PERFMON (as
    tests/test_least_privilege_vm.py saw on 6.12): counting goes on, the warning says what
    refuses it, and the entry keeps no start that no exit would end."""
    (tmp_path / "drm").mkdir()
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: {"BPF", "PERFMON"})
    monkeypatch.setattr(hooks, "in_module", lambda hook: hook == "drm_ioctl")
    reach = hooks.drm_exit
    monkeypatch.setattr(hooks, "drm_exit", lambda h: reach(h, tmp_path))
    kernel.refuse = {"kubenpu_drm_return"}
    with caplog.at_level(logging.INFO, logger=core.__name__):
        probe, _ = started(kernel)
    assert kernel.attached == [*ENTRIES, abi.BIRTHS]
    warned, said = [r.getMessage() for r in caplog.records]
    assert warned.startswith("call durations unavailable from drm_ioctl: attaching ")
    assert warned.endswith(
        "; perf_event_paranoid 3 and more (Debian's, Ubuntu's) refuse perf events without "
        "CAP_SYS_ADMIN, and lockdown=confidentiality kprobes; probe.durations_exit: syscall "
        "times them"
    )
    assert said == "counted calls untimed (no exit attached)"
    gate = bpfsys.lookup(kernel.fds[abi.GATE], abi.U32.pack(0), 4)
    assert gate == abi.U32.pack(abi.GATE_OPEN)
    probe.close()


def test_maps_are_sized_as_asked(kernel) -> None:
    probe, _ = started(kernel, ringbuf_pages=8, counts_entries=512)
    shapes = {name: bpfsys.map_shape(fd) for name, fd in kernel.fds.items()}
    assert shapes[abi.EVENTS].max_entries == 8 * abi.PAGE
    assert shapes[abi.COUNTS].max_entries == 512
    assert shapes[abi.DURATIONS].max_entries == abi.DURATIONS_ENTRIES
    probe.close()


def test_without_durations_no_exit_is_loaded_and_calls_are_not_timed(kernel) -> None:
    probe, _ = started(kernel, durations=False)
    assert kernel.attached == [*ENTRIES, abi.BIRTHS]
    assert "kubenpu_sys_exit" not in kernel.autoloaded
    gate = bpfsys.lookup(kernel.fds[abi.GATE], abi.U32.pack(0), 4)
    assert gate == abi.U32.pack(abi.GATE_OPEN)
    probe.close()


def test_events_mode_has_no_exits_nor_counts(kernel, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=core.__name__):
        probe, _ = started(kernel, mode="events")
    assert caplog.records == []  # events mode times nothing: no durations to miss
    assert not {"kubenpu_sys_exit", "kubenpu_compat_exit"} & kernel.autoloaded
    assert abi.COUNTS not in kernel.fds and abi.DURATIONS not in kernel.fds
    probe.close()


@pytest.mark.parametrize(("module", "attach"), [(False, "fentry"), (True, "fentry-module")])
def test_the_drm_hook_ends_its_calls_at_drm_ioctl(kernel, monkeypatch, module, attach) -> None:
    monkeypatch.setattr(hooks, "in_module", lambda hook: module and hook == "drm_ioctl")
    probe, said = started(kernel, hook="drm_ioctl")
    assert said == f"{attach} on drm_ioctl (core)"
    assert kernel.attached == ["kubenpu_drm_exit", "kubenpu_drm_ioctl", abi.BIRTHS]
    assert kernel.autoloaded == set(kernel.attached)
    probe.close()


def test_optional_attaches_warn_and_start_goes_on(kernel, caplog) -> None:
    kernel.refuse = {abi.BIRTHS, "kubenpu_compat_exit"}
    with caplog.at_level(logging.WARNING, logger=core.__name__):
        probe, _ = started(kernel, **SYSCALL)
    warned = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith("call durations unavailable from __ia32_compat_sys_ioctl: attaching ")
        for m in warned
    ), warned
    assert any(m.startswith("cgroup births unavailable (attaching ") for m in warned), warned
    assert kernel.attached == ["kubenpu_sys_exit", *ENTRIES]
    probe.close()


def test_a_kernel_without_the_exit_functions_counts_untimed(kernel, monkeypatch, caplog) -> None:
    monkeypatch.setattr(hooks, "kernel_symbols", lambda wanted: set())
    with caplog.at_level(logging.WARNING, logger=core.__name__):
        probe, _ = started(kernel, **SYSCALL)
    (warned,) = [r.getMessage() for r in caplog.records]
    assert warned == (
        "call durations unavailable: the kernel has none of "
        "__x64_sys_ioctl, __ia32_compat_sys_ioctl"
    )
    assert not {"kubenpu_sys_exit", "kubenpu_compat_exit"} & kernel.autoloaded
    probe.close()


def test_an_entry_that_does_not_attach_fails_the_start_and_detaches_the_rest(kernel) -> None:
    kernel.refuse = {abi.IOCTL_PROGRAMS[f"{HOOK}_compat"]}
    probe = CoreKernel([])
    with pytest.raises(ProbeError) as err:
        probe.start(lambda _: None)
    line = str(err.value)
    assert line.startswith(f"cannot attach to {HOOK}: core: attaching kubenpu_lsm_compat: ")
    assert line.endswith("kubenpu_lsm_compat: ENOTSUP: Operation not supported"), line
    assert sorted(kernel.destroyed) == sorted(kernel.attached)  # nothing left attached
    assert err.value.cause is Cause.OTHER


def test_kprobe_is_refused_before_libbpf(kernel) -> None:
    with pytest.raises(ProbeError) as err:
        CoreKernel([], attach="kprobe").start(lambda _: None)
    assert str(err.value) == "the CO-RE object has fentry programs only (probe.attach: kprobe)"
    assert kernel.autoloaded == set()


def test_the_digest_changes_with_every_setting_that_shapes_the_program(tmp_path) -> None:
    base = CoreKernel([]).digest()
    assert CoreKernel([]).digest() == base
    others = [
        CoreKernel([], ringbuf_pages=8),
        CoreKernel([], counts_entries=512),
        CoreKernel([], durations=False),
        CoreKernel([], **SYSCALL),
        CoreKernel([], mode="events"),
        CoreKernel([], path=tmp_path / "missing.bpf.o"),
    ]
    digests = {k.digest() for k in others}
    assert len(digests) == len(others) and base not in digests
    built = tmp_path / "kubenpu.bpf.o"  # a rebuilt object at the same path is another program
    built.write_bytes(b"one")
    first = CoreKernel([], path=built).digest()
    built.write_bytes(b"two")
    assert CoreKernel([], path=built).digest() != first


def _libbpf(messages: list[str]) -> core._Libbpf:
    lib = core.shared_libbpf()
    lib.messages.clear()
    lib.messages.extend(messages)
    return lib


# A refused program's warnings as libbpf 1.1 prints them (libbpf.c, bpf_object_load_prog).
VERIFIER = [
    "libbpf: prog 'kubenpu_lsm_ioctl': BPF program load failed: Permission denied",
    "libbpf: prog 'kubenpu_lsm_ioctl': -- BEGIN PROG LOAD LOG --\n"
    "0: R1=ctx() R10=fp0\n; int BPF_PROG(kubenpu_lsm_ioctl, struct file *file)\n"
    "0: (79) r6 = *(u64 *)(r1 +8)\nR6 invalid mem access 'scalar'\n"
    "processed 12 insns (limit 1000000) max_states_per_insn 0 total_states 1\n"
    "-- END PROG LOAD LOG --",
    "libbpf: prog 'kubenpu_lsm_ioctl': failed to load: -13",
    "libbpf: failed to load object 'kubenpu-aggregate.bpf.o'",
]


def test_why_is_the_first_warning_and_the_verifiers_reason() -> None:
    assert _libbpf(VERIFIER).why(-13) == (
        "libbpf: prog 'kubenpu_lsm_ioctl': BPF program load failed: Permission denied: "
        "R6 invalid mem access 'scalar' (EACCES: Permission denied)"
    )
    assert (
        _libbpf(["libbpf: a\nsecond line", "libbpf: b"]).why(2)
        == "libbpf: a (ENOENT: No such file or directory)"
    )
    assert _libbpf([]).why(-1) == "EPERM: Operation not permitted"
    lib = _libbpf(VERIFIER)
    assert lib.says("failed to load object") and not lib.says("BTF")


def test_only_libbpfs_warnings_are_kept(tmp_path) -> None:
    """libbpf calls the print callback for its debug and info lines too (opening a good object
    prints some); only warnings say why something failed."""
    lib = _libbpf([])
    obj = lib.open(core.object_path(True)) if core.object_path(True).exists() else None
    if obj is not None:
        lib.lib.bpf_object__close(obj)
        assert list(lib.messages) == []
    garbage = tmp_path / "garbage.bpf.o"
    garbage.write_bytes(b"\0" * 64)
    with pytest.raises(ProbeError) as err:
        lib.open(garbage)
    assert err.value.cause is Cause.OBJECT_CORRUPT
    assert lib.messages and all(m.startswith("libbpf: ") for m in lib.messages)
    assert all(m == m.strip() for m in lib.messages)
    assert str(err.value).startswith(f"opening {garbage}: libbpf: ")


def test_an_object_that_is_not_there_is_a_plain_error(tmp_path) -> None:
    lib = _libbpf([])
    with pytest.raises(ProbeError) as err:
        lib.open(tmp_path / "none.bpf.o")
    assert err.value.cause is Cause.OTHER and str(err.value).endswith(
        "(ENOENT: No such file or directory)"
    )


def test_a_map_the_object_lacks_is_said(kernel) -> None:
    lib = core.shared_libbpf()
    obj = lib.open(core.object_path(True))
    try:
        with pytest.raises(ProbeError, match=r"^the object has no map nosuch$"):
            lib.find_map(obj, "nosuch")
        with pytest.raises(ProbeError, match=r"^attaching nosuch: "):
            lib.attach(obj, "nosuch")
    finally:
        lib.lib.bpf_object__close(obj)


# --- a failed start's line, made in this process (test_start_errors makes the real causes in
# fresh processes, which mutmut cannot follow) ---------------------------------------------------

NO_BTF = "libbpf: failed to find valid kernel BTF"  # libbpf's words (btf__load_vmlinux_btf)


def refused(kernel: Kernel, monkeypatch, *warnings: str) -> None:
    """The load fails as this host's kernel answers it, after libbpf's warnings."""

    def load(obj: int) -> int:
        core.shared_libbpf().messages.extend(warnings)
        return -1  # EPERM

    monkeypatch.setattr(core.shared_libbpf().lib, "bpf_object__load", load)


def failed(probe: CoreKernel) -> ProbeError:
    with pytest.raises(ProbeError) as err:
        probe.start(lambda _: None)
    return err.value


def test_missing_capabilities_come_first(kernel, monkeypatch) -> None:
    refused(kernel, monkeypatch)
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: {"PERFMON"})
    err = failed(CoreKernel([]))
    assert err.cause is Cause.CAPABILITIES
    assert str(err) == (
        f"cannot attach to {HOOK}: core: missing CAP_BPF (probe.hook {HOOK} needs CAP_BPF + "
        "CAP_PERFMON; see docs/deploy.md): loading the object: EPERM: Operation not permitted"
    )


def test_eperm_with_every_capability_is_a_refusal_not_missing_capabilities(
    kernel, monkeypatch
) -> None:
    """It once printed libbpf's bare EPERM, and the docs sent EPERM to "no capabilities"."""
    refused(kernel, monkeypatch)
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: {"BPF", "PERFMON"})
    monkeypatch.setattr(hooks, "refusal", lambda hook: f"refused ({hook})")
    err = failed(CoreKernel([]))
    assert err.cause is Cause.REFUSED
    assert str(err) == (
        f"cannot attach to {HOOK}: core: refused ({HOOK}): loading the object: "
        "EPERM: Operation not permitted"
    )


def test_another_error_with_every_capability_is_said_as_it_is(kernel, monkeypatch) -> None:
    monkeypatch.setattr(core.shared_libbpf().lib, "bpf_object__load", lambda obj: -22)
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: {"BPF", "PERFMON"})
    err = failed(CoreKernel([]))
    assert (err.cause, str(err)) == (
        Cause.OTHER,
        f"cannot attach to {HOOK}: core: loading the object: EINVAL: Invalid argument",
    )


def test_drm_ioctl_in_a_drm_ko_without_btf_says_so(kernel, monkeypatch) -> None:
    refused(kernel, monkeypatch)
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: {"SYS_ADMIN"})
    monkeypatch.setattr(hooks, "module_without_btf", lambda hook: f"{hook}'s module has no BTF")
    err = failed(CoreKernel([], hook="drm_ioctl"))
    assert err.cause is Cause.NO_BTF
    assert str(err).startswith("cannot attach to drm_ioctl: core: drm_ioctl's module has no BTF: ")


@pytest.mark.parametrize("alone", [True, False])
def test_a_kernel_without_btf_says_so_and_names_bcc_only_alone(kernel, monkeypatch, alone) -> None:
    refused(kernel, monkeypatch, NO_BTF)
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: {"BPF", "PERFMON"})
    err = failed(CoreKernel([], alone=alone))
    assert err.cause is Cause.NO_BTF
    line = (
        f"cannot attach to {HOOK}: core: {core._NO_BTF_CAUSE}: loading the object: "
        f"{NO_BTF} (EPERM: Operation not permitted)"
    )
    assert str(err) == line + (core._NO_BTF_HINT if alone else "")
    assert "bccFallback" not in str(failed(CoreKernel([])))  # alone is off by default


def test_the_objects_own_cause_is_kept_before_capabilities_and_btf(
    kernel, monkeypatch, tmp_path
) -> None:
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: set())
    garbage = tmp_path / "garbage.bpf.o"
    garbage.write_bytes(b"\0" * 64)
    core.shared_libbpf().messages.append(NO_BTF)  # an earlier start's words: cleared
    err = failed(CoreKernel([], path=garbage, alone=True))
    assert err.cause is Cause.OBJECT_CORRUPT
    assert str(err).startswith(f"cannot attach to {HOOK}: core: opening {garbage}: libbpf: ")
    assert "missing" not in str(err) and "BTF" not in str(err)


def test_a_ring_that_does_not_open_is_a_start_failure_with_a_cause(kernel, monkeypatch) -> None:
    fd = kernel.map_fd

    def no_ring(found: int) -> int:
        return -1 if _OWN.bpf_map__name(found) == abi.EVENTS.encode() else fd(found)

    monkeypatch.setattr(core.shared_libbpf().lib, "bpf_map__fd", no_ring)
    monkeypatch.setattr(hooks, "effective_capabilities", lambda: {"BPF", "PERFMON"})
    err = failed(CoreKernel([]))  # a bpfsys.BpfError, which has no cause of its own
    assert err.cause is Cause.OTHER and str(err).startswith(f"cannot attach to {HOOK}: core: ")
    assert kernel.destroyed == kernel.attached  # what did attach is detached


def test_a_map_libbpf_will_not_size_is_said(kernel, monkeypatch) -> None:
    monkeypatch.setattr(core.shared_libbpf().lib, "bpf_map__set_max_entries", lambda m, n: -22)
    err = failed(CoreKernel([], ringbuf_pages=2))
    assert str(err) == f"cannot attach to {HOOK}: core: sizing the map events to {2 * abi.PAGE}"


@pytest.mark.parametrize(
    ("raised", "cause", "line"),
    [
        (
            OSError("libbpf.so.1: cannot open shared object file: No such file or directory"),
            Cause.NO_LIBBPF,
            "libbpf (libbpf.so.1) is needed for the CO-RE object: libbpf.so.1: cannot open "
            "shared object file: No such file or directory",
        ),
        (
            bpfsys.MissingSymbols("/usr/lib/libbpf.so.1 lacks bpf_map__fd"),
            Cause.OLD_LIBBPF,
            "/usr/lib/libbpf.so.1 lacks bpf_map__fd, which the CO-RE loader calls (libbpf 1.0 "
            "and later have them)",
        ),
    ],
)
def test_a_missing_or_old_libbpf_is_its_cause(monkeypatch, raised, cause, line) -> None:
    def libbpf(needed: tuple[str, ...]) -> ctypes.CDLL:
        raise raised

    monkeypatch.setattr(bpfsys, "libbpf", libbpf)
    monkeypatch.setattr(core, "shared_libbpf", core._Libbpf)  # a new one: the cached one loaded
    err = failed(CoreKernel([]))
    assert err.cause is cause and str(err) == f"cannot attach to {HOOK}: core: {line}"


@pytest.fixture
def fresh() -> Iterator[core._Libbpf]:
    """A new _Libbpf; libbpf's print callback is process-wide, so the shared one's is put back."""
    lib = core._Libbpf()
    yield lib
    shared = core.shared_libbpf()
    shared.lib.libbpf_set_print(shared._print)


def test_libbpfs_other_lines_are_formatted_only_for_a_debug_log(monkeypatch, caplog) -> None:
    if not core.object_path(True).exists():
        pytest.skip("make bpf has not built the CO-RE objects")
    lib = _libbpf([])
    formatted: list[bytes] = []
    vsnprintf = core._libc.vsnprintf
    monkeypatch.setattr(
        core._libc, "vsnprintf", lambda *a: (formatted.append(a[2]), vsnprintf(*a))[1]
    )
    with caplog.at_level(logging.INFO, logger=core.__name__):
        lib.lib.bpf_object__close(lib.open(core.object_path(True)))
    assert formatted == [] and caplog.records == []
    with caplog.at_level(logging.DEBUG, logger=core.__name__):
        lib.lib.bpf_object__close(lib.open(core.object_path(True)))
    assert formatted and len(caplog.records) == len(formatted)  # each line logged at debug


def test_a_new_libbpf_types_its_calls_and_keeps_libbpfs_warnings(fresh, tmp_path, caplog) -> None:
    for name, res, args in core._CALLS:
        fn = getattr(fresh.lib, name)
        assert (fn.restype, fn.argtypes) == (res, args), name
    # A path that is not UTF-8 (Linux allows any bytes but / and NUL) in libbpf's warning.
    garbage = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/\xff.bpf.o"))
    garbage.write_bytes(b"\0" * 64)
    with caplog.at_level(logging.DEBUG, logger=core.__name__), pytest.raises(ProbeError):
        fresh.open(garbage)
    assert fresh.messages and all(m.startswith("libbpf: ") for m in fresh.messages)
    assert "\ufffd.bpf.o" in fresh.messages[0]  # the byte replaced, not an exception
    assert [r.getMessage() for r in caplog.records][-len(fresh.messages) :] == list(
        fresh.messages
    )  # and each line in the debug log


def test_libbpfs_warnings_are_bounded(fresh, tmp_path) -> None:
    garbage = tmp_path / "garbage.bpf.o"
    garbage.write_bytes(b"\0" * 64)
    with pytest.raises(ProbeError):
        fresh.open(garbage)
    each = len(fresh.messages)
    for _ in range(20):  # failures no start clears the words of: the newest are kept
        with pytest.raises(ProbeError):
            fresh.open(garbage)
    assert each and len(fresh.messages) == 20


def test_a_verifier_log_of_one_line_is_its_reason() -> None:
    log = "libbpf: prog 'p': -- BEGIN PROG LOAD LOG --\ninvalid argument\n-- END PROG LOAD LOG --"
    lib = _libbpf(["libbpf: prog 'p': BPF program load failed: Invalid argument", log])
    assert lib.why(-22).endswith("Invalid argument: invalid argument (EINVAL: Invalid argument)")
