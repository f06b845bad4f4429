"""The kernel ABI (kubenpu/kernel/abi.py) against the C program it mirrors: the source's
constants, and the compiled CO-RE objects' maps, programs and struct layouts (read with the
system libbpf, which opens an object without loading it, and with bpftool's BTF dump). A change
on either side that the other does not follow fails here."""

from __future__ import annotations

import ctypes
import json
import re
import struct
import subprocess
from pathlib import Path

import pytest

from kubenpu import vendors
from kubenpu.kernel import abi
from kubenpu.kernel.bcc import BccKernel
from kubenpu.kernel.core import CoreKernel, object_path
from kubenpu.sources.calls.events import KERNEL_LOST

ROOT = Path(__file__).resolve().parents[1]
SOURCE = (ROOT / "bpf" / "kubenpu.bpf.c").read_text()
SLOTS = (ROOT / "bpf" / "slots.h").read_text()  # the bucket scheme, shared by every histogram
MAP_TYPES = {
    "hash": 1,
    "array": 2,
    "percpu_hash": 5,
    "percpu_array": 6,
    "ringbuf": 27,
    "task_storage": 29,
}


def defines(prefix: str) -> dict[str, int]:
    return {n.lower(): int(v, 0) for n, v in re.findall(rf"#define {prefix}(\w+) (\w+)", SOURCE)}


def test_constants_match_the_source():
    assert defines("LOST_") == {name: i for i, name in enumerate(abi.LOST_SLOTS)}
    gate = {"closed": 0, "open": 1, "handover": 2, "state": 3, "timed": 4}
    assert defines("GATE_") == gate
    assert (abi.GATE_CLOSED, abi.GATE_OPEN, abi.GATE_HANDOVER) == (0, 1, 2)
    assert (abi.GATE_STATE, abi.GATE_TIMED) == (3, 4)
    assert defines("DRM_COMMAND_") == {
        "base": abi.DRM_COMMAND_BASE,
        "end": abi.DRM_COMMAND_END,
    }
    assert defines("VENDOR_") == {"core": abi.VENDOR_CORE, "slots": abi.VENDOR_SLOTS}
    assert "#define DRM_IOCTL_TYPE 'd'" in SOURCE and ord("d") == abi.DRM_IOCTL_TYPE
    assert "u32 index = (slot << 8) | nr;" in SOURCE and abi.ioctl_index(3, 0x42) == 0x342
    assert [str(n) for n in KERNEL_LOST] == list(abi.LOST_SLOTS)
    majors = dict(re.findall(r"#define (DRM_MAJOR|ACCEL_MAJOR|MINOR_SLOTS) (\d+)", SOURCE))
    assert majors == {
        "DRM_MAJOR": str(abi.DRM_MAJOR),
        "ACCEL_MAJOR": str(abi.ACCEL_MAJOR),
        "MINOR_SLOTS": str(abi.MINOR_SLOTS),
    }
    assert "index = minor;" in SOURCE and "index = MINOR_SLOTS | minor;" in SOURCE
    assert (abi.minor_index(226, 128), abi.minor_index(261, 3)) == (128, 259)
    device = defines("DEVICE_")
    assert device == {"node_shift": abi.DEVICE_NODE_SHIFT, "vendor_mask": abi.DEVICE_VENDOR_MASK}
    assert abi.VENDOR_SLOTS <= abi.DEVICE_VENDOR_MASK  # a vendor id + 1 stays below the node
    assert "return node && node - 1 != (u32)bpf_get_numa_node_id();" in SOURCE
    assert abi.minor_index(226, 256) is None and abi.minor_index(189, 0) is None


def test_kinds_match_the_source():
    # the `ioctls` map comment names each kind's value; vendors.Kind is what user space fills
    assert "0 not counted, 1 submit, 2 alloc, 3 wait" in SOURCE
    assert {k.name.lower(): k.value for k in vendors.Kind} == {"submit": 1, "alloc": 2, "wait": 3}


def test_every_vendor_fits_the_ioctl_table():
    assert len(vendors.all_vendors()) < abi.VENDOR_SLOTS  # id 0 is the DRM core's


class _Object:
    """A CO-RE object opened (not loaded) with the system libbpf."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL("libbpf.so.1")
        p = ctypes.c_void_p
        for name, res, args in (
            ("bpf_object__open_file", p, [ctypes.c_char_p, p]),
            ("bpf_object__next_map", p, [p, p]),
            ("bpf_object__next_program", p, [p, p]),
            ("bpf_object__close", None, [p]),
            ("bpf_map__name", ctypes.c_char_p, [p]),
            ("bpf_map__type", ctypes.c_int, [p]),
            ("bpf_map__key_size", ctypes.c_uint32, [p]),
            ("bpf_map__value_size", ctypes.c_uint32, [p]),
            ("bpf_map__max_entries", ctypes.c_uint32, [p]),
            ("bpf_program__name", ctypes.c_char_p, [p]),
            ("bpf_program__section_name", ctypes.c_char_p, [p]),
        ):
            getattr(lib, name).restype, getattr(lib, name).argtypes = res, args
        self.lib = lib
        self.obj = lib.bpf_object__open_file(str(path).encode(), None)
        assert self.obj, f"libbpf cannot open {path}"

    def maps(self) -> dict[str, tuple[int, int, int, int]]:
        found, m, lib = {}, None, self.lib
        while m := lib.bpf_object__next_map(self.obj, m):
            found[lib.bpf_map__name(m).decode()] = (
                lib.bpf_map__type(m),
                lib.bpf_map__key_size(m),
                lib.bpf_map__value_size(m),
                lib.bpf_map__max_entries(m),
            )
        return found

    def programs(self) -> dict[str, str]:
        found, prog, lib = {}, None, self.lib
        while prog := lib.bpf_object__next_program(self.obj, prog):
            found[lib.bpf_program__name(prog).decode()] = lib.bpf_program__section_name(
                prog
            ).decode()
        return found


@pytest.fixture(params=[True, False], ids=["aggregate", "events"])
def built(request) -> tuple[bool, Path]:
    path = object_path(request.param)
    assert path.exists(), f"{path} is missing: `make bpf` builds it"
    return request.param, path


def test_object_maps_match_the_abi(built):
    aggregate, path = built
    maps = _Object(path).maps()
    u32, u64 = abi.U32.size, abi.U64.size
    expected = {
        abi.MINORS: (MAP_TYPES["array"], u32, u32, abi.MINORS_ENTRIES),
        abi.DEVICES: (MAP_TYPES["hash"], u32, u32, abi.DEVICES_ENTRIES),
        abi.IOCTLS: (MAP_TYPES["array"], u32, u32, abi.IOCTL_SLOTS),
        abi.LOST: (MAP_TYPES["percpu_array"], u32, u64, len(abi.LOST_SLOTS)),
        abi.EVENTS: (MAP_TYPES["ringbuf"], 0, 0, 256 * abi.PAGE),
        abi.GATE: (MAP_TYPES["array"], u32, u32, 1),
    }
    if aggregate:
        key = abi.COUNT_KEY.size
        count = abi.COUNT_VALUE.size
        expected[abi.COUNTS] = (MAP_TYPES["percpu_hash"], key, count, abi.COUNTS_ENTRIES)
        value = abi.DURATION_VALUE.size
        expected[abi.DURATIONS] = (MAP_TYPES["hash"], key, value, abi.DURATIONS_ENTRIES)
        expected[abi.STARTS] = (MAP_TYPES["task_storage"], u32, abi.START.size, 0)
        expected[abi.TEMPLATE] = (MAP_TYPES["array"], u32, value, 1)
    # libbpf adds the object's .rodata/.bss only when it has globals; it has none
    assert maps == expected
    # what an adoption checks pinned maps against (kernel/pins.py), at the object's default sizes
    durations = abi.DURATIONS_ENTRIES if aggregate else 0
    assert abi.map_shapes(aggregate, 256, abi.COUNTS_ENTRIES, durations) == expected


def test_object_programs_match_the_abi(built):
    programs = _Object(built[1]).programs()
    expected = {name: f"fentry/{function}" for function, name in abi.IOCTL_PROGRAMS.items()}
    expected[abi.BIRTHS] = f"tp_btf/{abi.BIRTHS_TRACEPOINT}"
    if built[0]:  # the exits of this build's architecture (x86 here)
        expected.update(
            {
                program: f"fexit/{function}"
                for exits in abi.EXIT_PROGRAMS.values()
                for function, program in exits.items()
                if not function.startswith("__arm64")
            }
        )
        expected.update({p: f"kretprobe/{f}" for f, p in abi.DRM_RETURN.items()})
    assert programs == expected


def _source_struct(name: str) -> list[tuple[str, str]]:
    """(field, type) of a struct of the C source, in order."""
    body = re.search(rf"struct {name} {{(.*?)}};", SOURCE, re.S)[1]
    return [(f, t) for t, f in re.findall(r"(u64|u32) (\w+);", body)]


@pytest.mark.parametrize(
    ("name", "packing"),
    [
        ("event", abi.EVENT),
        ("birth", abi.BIRTH),
        ("count_key", abi.COUNT_KEY),
        ("count_value", abi.COUNT_VALUE),
        ("start", abi.START),
    ],
)
def test_struct_layouts_match_the_source(name: str, packing: struct.Struct):
    fields = _source_struct(name)
    assert "".join({"u64": "Q", "u32": "I"}[t] for _, t in fields) == packing.format[1:]
    assert packing.size == 8 * sum(t == "u64" for _, t in fields) + 4 * sum(
        t == "u32" for _, t in fields
    )


def test_count_key_in_the_object_matches_ctypes():
    # the compiled object's BTF (the counts map's key type) against the batch reader's layout
    out = subprocess.run(
        ["bpftool", "-j", "btf", "dump", "file", str(object_path(True))],
        capture_output=True,
        check=True,
    ).stdout
    (key,) = [t for t in json.loads(out)["types"] if t.get("name") == "count_key"]
    members = [(m["name"], m["bits_offset"] // 8) for m in key["members"]]
    assert (key["size"], members) == (
        ctypes.sizeof(abi.CountKey),
        [(n, getattr(abi.CountKey, n).offset) for n, _ in abi.CountKey._fields_],
    )


def test_the_duration_math_matches_the_source():
    """bpf/slots.h's duration_slot and kubenpu.bpf.c's error_slot against abi's mirror."""
    assert f"#define BUCKETS {abi.BUCKETS}\n" in SLOTS
    assert f"#define FIRST_INDEX ({abi.FIRST_INDEX})" in SLOTS
    assert f"#define NS_TO_UNITS {abi.NS_TO_UNITS}ULL" in SLOTS
    assert f"#define OVER_NS {abi.OVER_NS}ULL" in SLOTS
    assert f"#define ERROR_SLOTS {len(abi.ERRORS)}" in SOURCE
    assert "(ns * NS_TO_UNITS) >> 16" in SLOTS and "units <= (1ULL << 20)" in SLOTS
    assert "4 * ((int)power - 40)" in SLOTS
    quarters = re.findall(r"top > (0x[0-9A-F]+)ULL", SLOTS)
    assert [int(q, 16) for q in quarters] == list(abi.QUARTERS)
    body = re.search(
        r"static __always_inline u32 error_slot\(long err\)\n\{(.*?)\n\}", SOURCE, re.S
    )
    cases: dict[int, list[int]] = {}
    for line in body[1].splitlines():
        if m := re.search(r"return (\d+);", line):
            for number in re.findall(r"case (\d+):", line):
                cases.setdefault(int(m[1]), []).append(int(number))
    assert cases == {i: list(ns) for i, ns in enumerate(abi.ERRNOS.values())}
    assert "default: return ERROR_SLOTS - 1;" in body[1]
    [(fields)] = re.findall(r"struct durations \{(.*?)\};", SOURCE, re.S)
    assert re.findall(r"u64 (\w+)", fields) == ["sum_ns", "slots", "errors"]
    assert "slots[DURATION_SLOTS]" in fields and "errors[ERROR_SLOTS]" in fields
    assert abi.DURATION_VALUE.size == 8 * (1 + abi.DURATION_SLOTS + len(abi.ERRORS))


@pytest.mark.parametrize(
    ("loader", "mode", "timed"),
    [("core", "aggregate", True), ("core", "events", False), ("bcc", "aggregate", False)],
)
def test_only_the_core_aggregate_probe_has_the_durations_maps(loader, mode, timed):
    """What a pinned probe must match (kernel/pins.py): the durations maps where the program
    times calls (docs/latency.md), none elsewhere."""
    kernel = (CoreKernel if loader == "core" else BccKernel)([], mode=mode)
    names = set(kernel.shapes()) & set(abi.DURATION_MAPS)
    assert names == (set(abi.DURATION_MAPS) if timed else set())


def test_probe_durations_off_attaches_no_exit_and_is_another_program():
    """probe.durations: false leaves every exit out (other ioctls pay nothing for it), and a
    pinned probe of the other setting is not adopted as this one (its digest differs)."""
    on = CoreKernel([], durations=True, durations_exit="syscall")
    off = CoreKernel([], durations=False)
    assert off._exits()[0] == {} and "kubenpu_sys_exit" in on._exits()[0].values()
    assert on.digest() != off.digest()
