"""Host-side checks of the kernel side's plumbing (kubenpu/kernel/): hooks, the BCC text, the
loader choice. Loading and attaching run in the VM (test_e2e_vm); the ABI is tests/test_abi.py."""

import contextlib
import ctypes
import os
import re
import tempfile
from pathlib import Path

import pytest
from fakes import PerCpuBpf
from helpers import make_config
from hypothesis import given
from hypothesis import strategies as st

from kubenpu import vendors
from kubenpu.discovery import Device, Node
from kubenpu.kernel import abi, bpfsys, core, maps
from kubenpu.kernel.abi import dev_t
from kubenpu.kernel.bcc import AttachPlan, BccKernel, attach_plans, source_text
from kubenpu.kernel.core import CoreKernel
from kubenpu.kernel.hooks import (
    effective_capabilities,
    kernel_symbols,
    missing_privileges,
    module_without_btf,
    refusal,
)
from kubenpu.kernel.loader import loaders
from kubenpu.kernel.maps import Maps, device_entries, device_slots, vendor_ids
from kubenpu.kernel.records import Durations
from kubenpu.sources.calls.events import Key

KALLSYMS_6_8 = (
    "0000000000000000 T security_file_ioctl\n0000000000000000 T security_file_ioctl_compat\n"
)


@pytest.fixture
def kallsyms(tmp_path) -> Path:
    path = tmp_path / "kallsyms"
    path.write_text("0000000000000000 T drm_ioctl\t[drm]\n" + KALLSYMS_6_8)
    return path


def test_module_drm_uses_module_kfunc_then_kprobe(tmp_path):
    (tmp_path / "drm").touch()
    plans = attach_plans("auto", "drm_ioctl", tmp_path)
    assert [p.attach for p in plans] == ["fentry-module", "kprobe"]
    (program,) = plans[0].programs
    assert program.header.startswith("MODULE_KFUNC_PROBE(drm, drm_ioctl,")
    assert program.fn_name == "kfunc__drm__drm_ioctl"


def test_builtin_drm_uses_kfunc(tmp_path):
    assert [p.attach for p in attach_plans("fentry", "drm_ioctl", tmp_path)] == ["fentry"]
    (program,) = attach_plans("auto", "drm_ioctl", tmp_path)[0].programs
    assert program.fn_name == "kfunc__vmlinux__drm_ioctl"


def test_kprobe_only_when_asked(tmp_path):
    assert [p.attach for p in attach_plans("kprobe", "drm_ioctl", tmp_path)] == ["kprobe"]


def test_lsm_hook_is_vmlinux_fentry_on_both_functions(tmp_path, kallsyms):
    (tmp_path / "drm").touch()  # a drm module does not matter to the vmlinux hook
    plans = attach_plans("auto", "security_file_ioctl", tmp_path, kallsyms)
    assert [p.attach for p in plans] == ["fentry", "kprobe"]
    assert [p.fn_name for p in plans[0].programs] == [
        "kfunc__vmlinux__security_file_ioctl",
        "kfunc__vmlinux__security_file_ioctl_compat",
    ]
    assert [p.function for p in plans[1].programs] == [
        "security_file_ioctl",
        "security_file_ioctl_compat",
    ]


def test_lsm_hook_without_the_compat_function(tmp_path):
    # Before 6.8 (without the backport) compat_sys_ioctl called security_file_ioctl itself.
    kallsyms = tmp_path / "kallsyms"
    kallsyms.write_text("0000000000000000 T security_file_ioctl\n0000000000000000 t x_compat\n")
    (plan,) = attach_plans("fentry", "security_file_ioctl", tmp_path, kallsyms)
    assert [p.function for p in plan.programs] == ["security_file_ioctl"]


@pytest.mark.parametrize(
    "plan",
    attach_plans("auto")
    + attach_plans("fentry")
    + attach_plans("auto", "security_file_ioctl", kallsyms=Path("/dev/null")),
)
def test_source_has_no_placeholders_left(plan: AttachPlan):
    text = source_text(plan)
    for program in plan.programs:
        assert program.header in text
    assert "KUBENPU_ATTACH" not in text
    assert not re.search(r'^#include "', text, re.M)  # BCC rewrites map calls in one file only


def test_each_function_gets_its_own_probe_body(tmp_path, kallsyms):
    (plan,) = attach_plans("fentry", "security_file_ioctl", tmp_path, kallsyms)
    text = source_text(plan)
    bcc_part = text[text.index("#ifdef KUBENPU_BCC\n/* Repeated") : text.index("#else\nSEC(")]
    assert bcc_part.count("return on_ioctl(filp, cmd);") == 2
    for program in plan.programs:
        assert f"{program.header}\n{{\n    return on_ioctl(filp, cmd);\n}}" in bcc_part
    assert text.count("kubenpu_cgroup_mkdir,") == 1  # what follows the probe: once


def test_effective_capabilities_decode_cap_eff(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython3\nCapPrm:\t000001ffffffffff\nCapEff:\t000000c000000000\n")
    assert effective_capabilities(status) == {"BPF", "PERFMON"}
    status.write_text("CapEff:\t0000000000200000\n")
    assert effective_capabilities(status) == {"SYS_ADMIN"}


@pytest.mark.parametrize(
    ("hook", "held", "hint"),
    [
        (
            "drm_ioctl",
            {"BPF", "PERFMON"},
            "missing CAP_SYS_ADMIN (probe.hook drm_ioctl needs CAP_SYS_ADMIN; ",
        ),
        (
            "security_file_ioctl",
            {"BPF"},
            "missing CAP_PERFMON (probe.hook security_file_ioctl needs CAP_BPF + CAP_PERFMON; ",
        ),
        ("security_file_ioctl", set(), "missing CAP_BPF, CAP_PERFMON ("),
        ("security_file_ioctl", {"SYS_ADMIN"}, ""),  # SYS_ADMIN passes every check
    ],
)
def test_missing_privileges_names_the_missing_capability(hook, held, hint):
    found = missing_privileges(hook, held)
    assert found.startswith(hint) if hint else found == ""


def test_vendor_ids_reserve_zero_for_the_core_table():
    ids = vendor_ids()
    assert ids[vendors.core().name] == 0
    assert sorted(ids.values()) == list(range(len(vendors.all_vendors()) + 1))


def test_loader_auto_tries_core_then_bcc():
    assert [type(k) for k in loaders([])] == [CoreKernel, BccKernel]
    assert [type(k) for k in loaders([], loader="core")] == [CoreKernel]
    assert [type(k) for k in loaders([], loader="bcc")] == [BccKernel]
    # the kprobe attach exists only in BCC
    assert [type(k) for k in loaders([], attach="kprobe")] == [BccKernel]


def test_device_table_puts_drm_and_accel_nodes_in_the_array_and_others_in_the_hash():
    by_node = {dev_t(226, 0): 3, dev_t(226, 128): 3, dev_t(261, 1): 7, dev_t(226, 300): 3}
    by_node[dev_t(189, 4)] = 2  # a node of another major (not DRM, not accel)
    slots, others = device_slots(by_node)
    assert {i: v for i, v in enumerate(slots) if v} == {0: 4, 128: 4, 257: 8}  # vendor id + 1
    assert others == {dev_t(226, 300): 3, dev_t(189, 4): 2}  # minors the array cannot index


def test_the_device_table_holds_each_devices_numa_node_beside_its_vendor() -> None:
    """The kernel reads the device's node from the table's value (node + 1 from bit 16, 0 for
    none): a device on node 1, one on node 0, and one without a node (-1 in sysfs, None when
    absent) whose calls count nothing remote."""
    node = lambda minor: (Node(f"/dev/dri/card{minor}", f"card{minor}", 226, minor),)  # noqa: E731
    on = {
        minor: Device(f"0000:0{minor}:00.0", "i915", None, numa, node(minor), "i915")
        for minor, numa in ((0, 1), (1, 0), (2, -1), (3, None))
    }
    entries = device_entries(on.values())
    i915 = vendor_ids()["i915"]
    assert entries == {
        dev_t(226, 0): 2 << 16 | i915,
        dev_t(226, 1): 1 << 16 | i915,
        dev_t(226, 2): i915,
        dev_t(226, 3): i915,
    }
    slots, _ = device_slots(entries)
    # the kernel's decoding (bpf/kubenpu.bpf.c device_vendor) of each slot
    decoded = {i: ((v & 0xFFFF) - 1, (v >> 16) - 1) for i, v in enumerate(slots) if v}
    assert decoded == {0: (i915, 1), 1: (i915, 0), 2: (i915, -1), 3: (i915, -1)}


def _packed(key: Key) -> bytes:
    return abi.COUNT_KEY.pack(key.cgroup_id, dev_t(key.major, key.minor), key.kind)


def test_per_cpu_maps_are_read_on_every_cpu(monkeypatch) -> None:
    """The kernel keeps a per-CPU map's value as one u64 per possible CPU: the lost slots and
    the counts (read in batches, a token between them) are the sums over all of them."""
    bpf = PerCpuBpf()
    assert bpf.ncpus >= 4
    bpf.install(monkeypatch)
    monkeypatch.setattr(maps, "_BATCH", 7)  # several batches of keys
    lost_fd, counts_fd = 10, 11
    for slot in range(len(abi.LOST_SLOTS)):
        bpf.add(lost_fd, abi.U32.pack(slot), 100 + slot)
    keys = [Key(1000 + i, 226, i % 3, 2) for i in range(30)]
    for i, k in enumerate(keys):
        bpf.add(counts_fd, _packed(k), 50 + i, i)  # {calls, remote}: i of them remote
    read = Maps({abi.LOST: lost_fd, abi.COUNTS: counts_fd})
    assert read.read_lost() == {name: 100 + slot for slot, name in enumerate(abi.LOST_SLOTS)}
    assert read.read_remote() == {}  # before a read of the counts
    assert read.read_counts() == {k: 50 + i for i, k in enumerate(keys)}
    assert read.read_remote() == {k: i for i, k in enumerate(keys)}
    # No one CPU's slot holds a value: a reader of CPU 0 alone would read less.
    assert all(
        max(cpu[0] for cpu in v) < sum(cpu[0] for cpu in v)
        for m in bpf.maps.values()
        for v in m.values()
    )


def test_a_read_stops_at_the_last_batch(monkeypatch) -> None:
    """After the last batch (ENOENT) the kernel's next answer is ENOENT without a count: a read
    that asked again would decode the buffers' leftovers."""
    bpf = PerCpuBpf()
    bpf.install(monkeypatch)
    monkeypatch.setattr(maps, "_BATCH", 7)
    keys = [Key(2000 + i, 226, 0, 2) for i in range(3)]  # fewer than one batch
    for k in keys:
        bpf.add(11, _packed(k), 9, 0)
    assert Maps({abi.COUNTS: 11}).read_counts() == dict.fromkeys(keys, 9)


def test_an_unchanged_counts_map_is_not_decoded_again(monkeypatch) -> None:
    """An idle node's counts read the same at every read: the reader compares the batches'
    bytes and decodes nothing (with 1,000 pods that decoding was O(keys) Python every 5 s); a
    key one call further, one more key, or a key gone is read at once; and what a read returns
    is the caller's to change."""
    bpf = PerCpuBpf()
    bpf.install(monkeypatch)
    monkeypatch.setattr(maps, "_BATCH", 7)
    keys = [Key(3000 + i, 226, 0, 2) for i in range(10)]
    for k in keys:
        bpf.add(11, _packed(k), 4, 1)
    reader = maps.CountsReader(11)
    decoded = []
    decode = reader._decode
    monkeypatch.setattr(reader, "_decode", lambda *a: (decoded.append(1), decode(*a)))
    first = reader.read()
    assert first == dict.fromkeys(keys, 4) and len(decoded) == 2  # two batches
    first.clear()
    assert reader.read() == dict.fromkeys(keys, 4) and len(decoded) == 2  # nothing decoded
    bpf.add(11, _packed(keys[-1]), 1, 1)  # one remote call, in the last batch
    assert reader.read() == {**dict.fromkeys(keys, 4), keys[-1]: 5} and len(decoded) == 4
    assert reader.remote() == {**dict.fromkeys(keys, 1), keys[-1]: 2}
    del bpf.maps[11][_packed(keys[0])]
    assert reader.read() == {**dict.fromkeys(keys[1:], 4), keys[-1]: 5}


@pytest.mark.parametrize("mode", ["aggregate", "events"])
def test_the_core_loader_sizes_its_maps_as_the_config_asks(tmp_path, monkeypatch, mode) -> None:
    """probe.ringbuf_pages reaches libbpf's bpf_map__set_max_entries on the opened object
    before its load (the load is refused here: no VM, no privileges), and `counts` keeps its
    size; what the kernel then makes of them is checked in the VM (test_restart_vm)."""
    if not core.object_path(mode == "aggregate").exists():
        pytest.skip("make bpf has not built the CO-RE objects")
    cfg = make_config(tmp_path, f"probe:\n  ringbuf_pages: 64\n  mode: {mode}\n")
    own = ctypes.CDLL("libbpf.so.1")  # its own typed handles: the loader's stay as they are
    find, entries = own.bpf_object__find_map_by_name, own.bpf_map__max_entries
    find.restype, find.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    entries.restype, entries.argtypes = ctypes.c_uint32, [ctypes.c_void_p]
    sized: dict[str, int | None] = {}

    def load(obj: int) -> int:
        for name in (abi.EVENTS, abi.COUNTS):
            found = find(obj, name.encode())
            sized[name] = entries(found) if found else None
        return -1  # EPERM, as an unprivileged load is answered

    monkeypatch.setattr(core.shared_libbpf().lib, "bpf_object__load", load)
    [kernel] = loaders(
        [], loader="core", mode=cfg.probe.mode, ringbuf_pages=cfg.probe.ringbuf_pages
    )
    with pytest.raises(core.ProbeError, match="loading the object"):
        kernel.start(lambda _: None)
    counts = abi.COUNTS_ENTRIES if mode == "aggregate" else None
    assert sized == {abi.EVENTS: 64 * abi.PAGE, abi.COUNTS: counts}


def _durations_value(sum_ns: int, slots: dict[int, int], errors: dict[str, int]) -> bytes:
    all_slots = [slots.get(i, 0) for i in range(abi.DURATION_SLOTS)]
    all_errors = [errors.get(name, 0) for name in abi.ERRORS]
    return abi.DURATION_VALUE.pack(sum_ns, *all_slots, *all_errors)


def test_durations_are_read_and_forgotten_with_the_counts() -> None:
    """Real kernel maps of the program's shapes (bpf(2) on the host: no program runs): every
    key's sum, slots and errors read back in place, and forget_counts deletes a gone cgroup's
    key from both maps, leaving the others."""
    shapes = abi.map_shapes(True, 1, 64, 64)
    fds = {
        name: bpfsys.map_create(*shapes[name], name)
        for name in (abi.COUNTS, abi.DURATIONS, abi.LOST, abi.GATE)
    }
    try:
        gone, kept = Key(1234, 226, 1, 3), Key(99, 261, 0, 1)
        values = {
            gone: (5_000_000, {1: 2, 57: 3, abi.BUCKETS + 1: 1}, {"ETIME": 4, "other": 1}),
            kept: (17, {0: 1}, {}),
        }
        for key, (total, slots, errors) in values.items():
            packed = _packed(key)
            bpfsys.update(fds[abi.DURATIONS], packed, _durations_value(total, slots, errors))
            bpfsys.update(
                fds[abi.COUNTS], packed, b"\0" * abi.COUNT_VALUE.size * bpfsys.possible_cpus()
            )
        read = Maps(fds).read_durations()
        assert set(read) == {gone, kept}
        assert read[gone].sum_ns == 5_000_000
        assert {i: n for i, n in enumerate(read[gone].slots) if n} == {1: 2, 57: 3, 105: 1}
        errors = dict(zip(abi.ERRORS, read[gone].errors, strict=True))
        assert {e: n for e, n in errors.items() if n} == {"ETIME": 4, "other": 1}
        assert read[kept] == Durations(17, (1,) + (0,) * (abi.DURATION_SLOTS - 1), (0,) * 15)
        probe = Maps(fds)
        assert set(probe.read_counts()) == {gone, kept}
        probe.forget_counts([gone])
        assert set(probe.read_durations()) == set(probe.read_counts()) == {kept}
        assert gone not in probe._reader._known.values()  # the decoder's Key cache lets it go
        assert Maps({abi.COUNTS: fds[abi.COUNTS]}).read_durations() == {}  # no timing program
    finally:
        for fd in fds.values():
            os.close(fd)


def test_a_node_with_no_calls_yet_reads_empty_maps_and_then_its_first_key() -> None:
    """An agent started before any pod's first call reads empty counts and durations maps (no
    batch at all, so nothing differs from the reader's empty start): both read as empty, again
    and again, and the first key is read as soon as it is there."""
    shapes = abi.map_shapes(True, 1, 64, 64)
    fds = {name: bpfsys.map_create(*shapes[name], name) for name in (abi.COUNTS, abi.DURATIONS)}
    try:
        probe = Maps(fds)
        for _ in range(2):
            assert probe.read_counts() == {} and probe.read_durations() == {}
        key = Key(4321, 226, 0, 2)
        ncpus = bpfsys.possible_cpus()
        bpfsys.update(fds[abi.COUNTS], _packed(key), abi.COUNT_VALUE.pack(3, 0) * ncpus)
        bpfsys.update(fds[abi.DURATIONS], _packed(key), _durations_value(7, {0: 1}, {}))
        assert probe.read_counts() == {key: 3 * ncpus}
        assert probe.read_durations()[key].sum_ns == 7
    finally:
        for fd in fds.values():
            os.close(fd)


@pytest.mark.parametrize("on", [True, False])
def test_the_timing_switch_and_the_gate_are_written_where_the_program_reads_them(on) -> None:
    """The entry reads slot 0 of `gate` once (bpf/kubenpu.bpf.c): its state and, beside it, the
    GATE_TIMED bit. A hand-over's state changes keep the bit, and the switch keeps the state."""
    shapes = abi.map_shapes(True, 1, 64, 64)
    fd = bpfsys.map_create(*shapes[abi.GATE], abi.GATE)
    zero, timed = abi.U32.pack(0), abi.GATE_TIMED if on else 0
    try:
        maps = Maps({abi.GATE: fd})
        maps.set_gate(abi.GATE_CLOSED)
        maps.set_timing(on)
        assert bpfsys.lookup(fd, zero, 4) == abi.U32.pack(abi.GATE_CLOSED | timed)
        for state in (abi.GATE_HANDOVER, abi.GATE_OPEN):
            maps.set_gate(state)
            assert bpfsys.lookup(fd, zero, 4) == abi.U32.pack(state | timed)
        maps.set_timing(not on)
        flipped = 0 if on else abi.GATE_TIMED
        assert bpfsys.lookup(fd, zero, 4) == abi.U32.pack(abi.GATE_OPEN | flipped)
    finally:
        os.close(fd)


def test_the_device_and_ioctl_tables_are_what_the_kernel_filters_by() -> None:
    """fill() on real maps: a DRM and an accel node in `minors` (vendor id + 1), a node of
    another major in `devices`, each vendor's nrs (and the core's) in `ioctls`; a second fill
    without the accel device clears its slot and the hash's stale entry; empty_devices (the
    hand-over) leaves nothing counted."""
    shapes = abi.map_shapes(True, 1, 64)
    names = (abi.MINORS, abi.DEVICES, abi.IOCTLS)
    fds = {name: bpfsys.map_create(*shapes[name], name) for name in names}
    ids = vendor_ids()
    vgem = Device(
        "platform:vgem", "vgem", None, None, (Node("/dev/dri/card0", "card0", 226, 0),), "vgem"
    )
    ivpu = Device(
        "0000:00:0b.0",
        "intel_vpu",
        None,
        None,
        (Node("/dev/accel/accel0", "accel0", 261, 0), Node("/dev/x", "x", 189, 4)),
        "ivpu",
    )

    def table(name: str, size: int) -> dict[int, int]:
        found = {}
        for i in range(size):
            raw = bpfsys.lookup(fds[name], abi.U32.pack(i), 4)
            if raw and (v := abi.U32.unpack(raw)[0]):
                found[i] = v
        return found

    def others() -> dict[int, int]:
        raw = {k: bpfsys.lookup(fds[abi.DEVICES], k, 4) for k in bpfsys.keys(fds[abi.DEVICES], 4)}
        return {abi.U32.unpack(k)[0]: abi.U32.unpack(v)[0] for k, v in raw.items()}

    try:
        Maps(fds).fill([vgem, ivpu])
        assert table(abi.MINORS, abi.MINORS_ENTRIES) == {0: ids["vgem"] + 1, 256: ids["ivpu"] + 1}
        assert others() == {dev_t(189, 4): ids["ivpu"]}
        ioctls = table(abi.IOCTLS, abi.IOCTL_SLOTS)
        for vendor in (vendors.core(), vendors.by_name("vgem"), vendors.by_name("ivpu")):
            for i in vendor.ioctls:
                assert ioctls[abi.ioctl_index(ids[vendor.name], i.nr)] == int(i.kind)
        assert len(ioctls) == sum(
            len(v.ioctls)
            for v in (vendors.core(), vendors.by_name("vgem"), vendors.by_name("ivpu"))
        )
        Maps(fds).fill([vgem])
        assert table(abi.MINORS, abi.MINORS_ENTRIES) == {0: ids["vgem"] + 1}
        assert others() == {}
        Maps(fds).fill([vgem, ivpu])
        maps.empty_devices(fds)
        assert (table(abi.MINORS, abi.MINORS_ENTRIES), others()) == ({}, {})
    finally:
        for fd in fds.values():
            os.close(fd)


def test_counts_are_unsigned_and_forgetting_needs_neither_a_read_key_nor_durations() -> None:
    """Real kernel maps (bpf(2) on the host). A u64 count past 2^63 is a count, not a negative
    number; a key added after the last read is deleted by forget_counts all the same; and a
    program without the durations map (the BCC one, an older layout) forgets its counts only."""
    shape = abi.map_shapes(True, 1, 64)[abi.COUNTS]
    fd = bpfsys.map_create(*shape, abi.COUNTS)
    ncpus = bpfsys.possible_cpus()
    try:
        big, late = Key(1, 226, 0, 2), Key(2, 226, 1, 2)
        value = abi.COUNT_VALUE.pack(2**63 + 5, 2**63 + 1) + b"\0" * 16 * (ncpus - 1)
        bpfsys.update(fd, _packed(big), value)
        probe = Maps({abi.COUNTS: fd})
        assert probe.read_counts() == {big: 2**63 + 5}
        assert probe.read_remote() == {big: 2**63 + 1}
        bpfsys.update(fd, _packed(late), b"\0" * 16 * ncpus)
        probe.forget_counts([late])  # never read: not in the decoder's cache
        assert probe.read_counts() == {big: 2**63 + 5}
    finally:
        os.close(fd)


def test_an_older_programs_shorter_lost_map_reads_its_missing_slots_as_zero() -> None:
    """A pinned probe adopted from an older release has fewer `lost` slots (abi.LOST_SLOTS only
    grows): those it lacks read 0, the others their sum over every CPU."""
    kind, key_size, value_size, _ = abi.map_shapes(True, 1, 64)[abi.LOST]
    fd = bpfsys.map_create(kind, key_size, value_size, 1, abi.LOST)
    ncpus = bpfsys.possible_cpus()
    try:
        bpfsys.update(fd, abi.U32.pack(0), b"".join(abi.U64.pack(3) for _ in range(ncpus)))
        found = Maps({abi.LOST: fd}).read_lost()
        assert found == {name: 3 * ncpus if i == 0 else 0 for i, name in enumerate(abi.LOST_SLOTS)}
    finally:
        os.close(fd)


@pytest.mark.parametrize("name", [abi.COUNTS, abi.DURATIONS])
def test_a_failed_read_says_which_map_failed(name: str) -> None:
    with (
        open(os.devnull) as null,  # not a BPF map: the batch lookup fails
        pytest.raises(core.ProbeError, match=rf"^reading the {name} map failed: "),
    ):
        probe = Maps({name: null.fileno()})
        read = probe.read_counts if name == abi.COUNTS else probe.read_durations
        read()


def test_durations_are_read_in_batches_and_unpacked_only_when_changed() -> None:
    """A real hash of the program's shape holding more keys than one batch: every key read,
    an unchanged value not unpacked again (the same object), a changed one read anew, a
    deleted key gone at the next read (no listing-then-lookup race left to skip)."""
    shapes = abi.map_shapes(True, 1, 64, 2 * maps._DURATIONS_BATCH + 10)
    fd = bpfsys.map_create(*shapes[abi.DURATIONS], abi.DURATIONS)
    try:
        keys = [Key(10 + i, 226, 0, 2) for i in range(maps._DURATIONS_BATCH + 5)]
        for key in keys:
            bpfsys.update(fd, _packed(key), _durations_value(7, {}, {}))
        m = Maps({abi.COUNTS: -1, abi.DURATIONS: fd})
        first = m.read_durations()
        assert set(first) == set(keys)
        assert first[keys[0]] == Durations(7, (0,) * abi.DURATION_SLOTS, (0,) * 15)
        bpfsys.update(fd, _packed(keys[1]), _durations_value(9, {3: 1}, {}))
        bpfsys.delete(fd, _packed(keys[2]))
        second = m.read_durations()
        assert second[keys[0]] is first[keys[0]]  # unchanged: not unpacked again
        assert second[keys[1]].sum_ns == 9 and second[keys[1]].slots[3] == 1
        assert keys[2] not in second and len(second) == len(keys) - 1
    finally:
        os.close(fd)


class Unread:
    """A kallsyms whose lines past `lines` must not be read: reading on fails the test."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def open(self) -> contextlib.AbstractContextManager:
        def lines():
            yield from self.lines
            raise AssertionError("read past the last wanted name")

        return contextlib.nullcontext(lines())


def test_kernel_symbols_reads_kallsyms_once_and_stops_at_the_last_name_wanted(tmp_path) -> None:
    lines = [
        "ffffffff81000000 T _stext\n",
        "ffffffff81000010 T __x64_sys_ioctl.cold\n",  # a name of its own, not the one wanted
        "ffffffff81000020 T\n",  # no name: skipped, not an error
        "ffffffff81000030 T security_file_ioctl_compat\n",
        "ffffffff81000040 T __x64_sys_ioctl\n",
    ]
    wanted = {"security_file_ioctl_compat", "__x64_sys_ioctl"}
    assert kernel_symbols(wanted, Unread(lines)) == wanted
    assert kernel_symbols(set(), Unread([])) == set()  # nothing wanted: nothing read
    ends = tmp_path / "kallsyms"
    ends.write_text("0 t x_compat\n")
    assert kernel_symbols({"__x64_sys_ioctl"}, ends) == set()  # the end reached: not found
    assert kernel_symbols({"x_compat"}, ends) == {"x_compat"}
    assert kernel_symbols({"x_compat"}, ends, hint="ioctl") == set()  # its line skipped


_names = st.sampled_from(["drm_ioctl", "drm_open", "x_compat", "__x64_sys_ioctl", "a", "drm"])
_lines = st.one_of(
    st.tuples(st.sampled_from("TtDd"), _names, st.sampled_from(["", "\t[drm]"])).map(
        lambda t: f"ffffffff81000000 {t[0]} {t[1]}{t[2]}\n"
    ),
    st.sampled_from(["\n", "ffffffff81000000 T\n", "garbage\n"]),  # no name: skipped
)


def _name(line: str) -> str | None:
    fields = line.split(maxsplit=3)
    return fields[2] if len(fields) > 2 else None


@given(st.lists(_lines, max_size=12), st.sets(_names), st.sampled_from(["", "drm"]))
def test_kernel_symbols_are_the_wanted_names_kallsyms_lists(lines, wanted, hint) -> None:
    """For any kallsyms and wanted names (each holding the hint): exactly those listed as a
    line's name; and once the last of them is listed, nothing after it is read."""
    wanted = {n for n in wanted if hint in n}
    listed = {_name(line) for line in lines}
    with tempfile.TemporaryDirectory() as tmp:
        kallsyms = Path(tmp) / "kallsyms"
        kallsyms.write_text("".join(lines))
        assert kernel_symbols(wanted, kallsyms, hint) == wanted & listed
    if wanted and wanted <= listed:  # the pass ends at the line of the last one
        read, seen = [], set()
        for line in lines:
            read.append(line)
            seen.add(_name(line))
            if wanted <= seen:
                break
        assert kernel_symbols(wanted, Unread(read), hint) == wanted


def test_drm_ko_without_btf_is_named_only_where_it_is_a_loaded_module(tmp_path):
    modules, btf = tmp_path / "module", tmp_path / "btf"
    btf.mkdir()
    assert module_without_btf("drm_ioctl", modules, btf) == ""  # no drm.ko: built in
    (modules / "drm").mkdir(parents=True)
    assert module_without_btf("drm_ioctl", modules, btf) == ""  # built in, with parameters
    (modules / "drm" / "initstate").write_text("live\n")
    assert module_without_btf("drm_ioctl", modules, btf).startswith("drm.ko has no BTF")
    assert module_without_btf("security_file_ioctl", modules, btf) == ""
    (btf / "drm").write_bytes(b"")
    assert module_without_btf("drm_ioctl", modules, btf) == ""


@pytest.mark.parametrize(
    ("seccomp", "label", "suspects"),
    [
        ("0", "unconfined\n", ["a kernel"]),
        ("2", "", ["a seccomp filter", "a kernel"]),
        ("2", "cri-containerd.apparmor.d (enforce)\n", ["a seccomp", "the security", "a kernel"]),
        ("0", "system_u:system_r:container_t:s0:c1,c2\0", ["the security module", "a kernel"]),
    ],
)
def test_a_refusal_names_what_the_agent_sees_of_its_confinement(tmp_path, seccomp, label, suspects):
    status, lsm = tmp_path / "status", tmp_path / "current"
    status.write_text(f"Name:\tkubenpu\nSeccomp:\t{seccomp}\nSeccomp_filters:\t1\n")
    lsm.write_text(label)
    line = refusal("security_file_ioctl", status, lsm)
    assert line.startswith("refused although the agent holds CAP_BPF + CAP_PERFMON: ")
    said = line.split(": ", 1)[1].split(", or ")
    assert [s for s, want in zip(said, suspects, strict=True) if not s.startswith(want)] == []
