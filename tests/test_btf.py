"""kubenpu.kernel.btf: a module's split BTF made whole, checked against libbpf's own parser (the
host's libbpf.so.1) on the host's real /sys/kernel/btf/vmlinux, with a small module BTF split
over it written here as pahole writes one: ids after vmlinux's last, its own strings after
vmlinux's, and one name (`name`) taken from vmlinux's strings."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import pytest

from kubenpu.kernel import bpfsys, btf
from kubenpu.kernel.errors import ProbeError

VMLINUX = Path("/sys/kernel/btf/vmlinux")
KIND_INT, KIND_PTR, KIND_STRUCT = 1, 2, 4
TYPE = struct.Struct("=III")  # struct btf_type: name_off, info, size or type
MEMBER = struct.Struct("=III")  # struct btf_member: name_off, type, offset in bits

pytestmark = pytest.mark.skipif(not VMLINUX.exists(), reason="the host kernel has no BTF")


@pytest.fixture(scope="module")
def libbpf() -> ctypes.CDLL:
    lib = bpfsys.libbpf(("btf__parse", "btf__parse_split", "btf__type_cnt"))
    p, c = ctypes.c_void_p, ctypes.c_char_p
    for name, res, args in (
        ("btf__parse", p, [c, p]),
        ("btf__parse_split", p, [c, p]),
        ("btf__type_cnt", ctypes.c_uint32, [p]),
        ("btf__find_by_name_kind", ctypes.c_int32, [p, c, ctypes.c_uint32]),
        ("btf__type_by_id", p, [p, ctypes.c_uint32]),
        ("btf__name_by_offset", c, [p, ctypes.c_uint32]),
        ("btf__free", None, [p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


class Split:
    """A module's split BTF over `base`: types numbered from base's count, strings from its
    string section's length."""

    def __init__(self, base: bytes, base_types: int) -> None:
        self.base = base
        self.next_id = base_types
        self.types = b""
        self.strings = b"\0"
        self.first_string = len(btf.sections(base, "vmlinux")[1])

    def string(self, name: str) -> int:
        self.strings += name.encode() + b"\0"
        return self.first_string + len(self.strings) - len(name) - 1

    def add(self, kind: int, name_off: int, size_or_type: int, tail: bytes = b"", vlen=0) -> int:
        self.types += TYPE.pack(name_off, kind << 24 | vlen, size_or_type) + tail
        self.next_id += 1
        return self.next_id - 1

    def raw(self) -> bytes:
        types, strings = len(self.types), len(self.strings)
        header = btf.HEADER.pack(btf.MAGIC, 1, 0, btf.HEADER.size, 0, types, types, strings)
        return header + self.types + self.strings


def _id(lib: ctypes.CDLL, handle: int, name: str, kind: int) -> int:
    found = lib.btf__find_by_name_kind(handle, name.encode(), kind)
    assert found > 0, name
    return found


def _members(lib: ctypes.CDLL, handle: int, type_id: int) -> list[tuple[str, int, int]]:
    """(name, type id, bit offset) of a struct's members, as libbpf reads them."""
    ptr = lib.btf__type_by_id(handle, type_id)
    vlen = TYPE.unpack(ctypes.string_at(ptr, TYPE.size))[1] & 0xFFFF
    raw = ctypes.string_at(ptr + TYPE.size, vlen * MEMBER.size)
    return [
        (lib.btf__name_by_offset(handle, n).decode(), t, o) for n, t, o in MEMBER.iter_unpack(raw)
    ]


@pytest.fixture(scope="module")
def module_btf(libbpf, tmp_path_factory) -> tuple[Path, int]:
    """A sysfs-like directory: the host's vmlinux and a `gpu_sched` split over it, with
    struct drm_gpu_scheduler {const char *name; struct device *dev; long work_tdr; u8 last;}."""
    root = tmp_path_factory.mktemp("btf")
    base = VMLINUX.read_bytes()
    (root / "vmlinux").write_bytes(base)
    handle = libbpf.btf__parse(str(VMLINUX).encode(), None)
    try:
        count = libbpf.btf__type_cnt(handle)
        device = _id(libbpf, handle, "device", KIND_STRUCT)
        char, long = (_id(libbpf, handle, n, KIND_INT) for n in ("char", "long int"))
    finally:
        libbpf.btf__free(handle)
    split = Split(base, count)
    u8 = split.add(KIND_INT, split.string("kubenpu_u8"), 1, struct.pack("=I", 8))
    char_ptr = split.add(KIND_PTR, 0, char)
    device_ptr = split.add(KIND_PTR, 0, device)
    name = btf.sections(base, "")[1].index(b"\0name\0") + 1  # vmlinux's string, as pahole dedups
    members = [
        (name, char_ptr, 0),
        (split.string("dev"), device_ptr, 64),
        (split.string("work_tdr"), long, 128),
        (split.string("last"), u8, 192),
    ]
    tail = b"".join(MEMBER.pack(*m) for m in members)
    split.add(KIND_STRUCT, split.string("drm_gpu_scheduler"), 32, tail, vlen=len(members))
    (root / "gpu_sched").write_bytes(split.raw())
    return root, count


def _parse(libbpf, path: Path, base: int | None = None) -> int:
    handle = libbpf.btf__parse_split(str(path).encode(), base) if base else None
    handle = handle or libbpf.btf__parse(str(path).encode(), None)
    assert handle, f"libbpf refused {path}"
    return handle


def test_the_whole_btf_means_what_the_split_meant(libbpf, module_btf, tmp_path):
    """libbpf reads the merged file alone as it reads the split over vmlinux: the same count,
    the module's struct at the same id, its members' names (one from vmlinux's strings), types
    (vmlinux's struct device, the module's own int) and offsets."""
    root, base_count = module_btf
    merged = tmp_path / "whole.btf"
    merged.write_bytes(btf.module("gpu_sched", root))
    base = _parse(libbpf, root / "vmlinux")
    split, whole = _parse(libbpf, root / "gpu_sched", base), _parse(libbpf, merged)
    try:
        assert libbpf.btf__type_cnt(whole) == libbpf.btf__type_cnt(split) == base_count + 4
        sched = _id(libbpf, split, "drm_gpu_scheduler", KIND_STRUCT)
        assert _id(libbpf, whole, "drm_gpu_scheduler", KIND_STRUCT) == sched == base_count + 3
        members = _members(libbpf, whole, sched)
        assert members == _members(libbpf, split, sched)
        assert [n for n, _, _ in members] == ["name", "dev", "work_tdr", "last"]
        assert [o for _, _, o in members] == [0, 64, 128, 192]
        device_ptr = libbpf.btf__type_by_id(whole, members[1][1])
        device = TYPE.unpack(ctypes.string_at(device_ptr, TYPE.size))[2]
        assert device == _id(libbpf, whole, "device", KIND_STRUCT) < base_count
    finally:
        for handle in (whole, split, base):
            libbpf.btf__free(handle)


def test_a_missing_module_btf_is_one_line(tmp_path):
    (tmp_path / "vmlinux").write_bytes(VMLINUX.read_bytes()[:4096])
    with pytest.raises(ProbeError) as err:
        btf.module("gpu_sched", tmp_path)
    assert str(err.value) == (
        f"no BTF of the gpu_sched module ({tmp_path}/gpu_sched: No such file or directory)"
    )


@pytest.mark.parametrize(
    ("cut", "said"),
    [
        (lambda raw: raw[:10], "truncated BTF (10 bytes, a header is 24)"),
        (lambda raw: raw[: len(raw) - 1], "truncated BTF ("),
        (lambda raw: b"\x9f\xeb"[::-1] + raw[2:], "not BTF (magic 0x9feb, want 0xeb9f)"),
        (lambda raw: raw[:2] + b"\x02" + raw[3:], "BTF version 2, header 24 bytes"),
    ],
)
def test_a_broken_module_btf_is_one_line(module_btf, tmp_path, cut, said):
    root, _ = module_btf
    (tmp_path / "vmlinux").write_bytes((root / "vmlinux").read_bytes())
    (tmp_path / "gpu_sched").write_bytes(cut((root / "gpu_sched").read_bytes()))
    with pytest.raises(ProbeError) as err:
        btf.module("gpu_sched", tmp_path)
    assert str(err.value).startswith(f"{tmp_path}/gpu_sched: {said}")
    assert "\n" not in str(err.value)
