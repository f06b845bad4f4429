"""A module's split BTF made whole, for libbpf's CO-RE relocations without CAP_SYS_ADMIN.

libbpf finds a module's types through its BTF object (BPF_BTF_GET_NEXT_ID, GET_FD_BY_ID), which
only CAP_SYS_ADMIN may look up. The same BTF is world-readable in /sys/kernel/btf/MODULE: split
BTF over /sys/kernel/btf/vmlinux, whose type ids continue the base's last id and whose string
offsets continue the base's string section. So the base's types then the module's, and the
base's strings then the module's, under one header, are one standalone BTF in which every id
and offset means what it meant: libbpf takes it as the object's btf_custom_path (docs/jobs.md).
"""

from __future__ import annotations

import struct
from pathlib import Path

from kubenpu.kernel.errors import ProbeError

# struct btf_header (include/uapi/linux/btf.h): magic, version, flags, hdr_len, then the type and
# string sections' offsets (from the header's end) and lengths.
HEADER = struct.Struct("=HBBIIIII")
MAGIC = 0xEB9F
VERSION = 1
SYSFS = Path("/sys/kernel/btf")


def sections(raw: bytes, what: str) -> tuple[bytes, bytes]:
    """The type and string sections of one BTF blob; ProbeError (one line) if it is not one."""
    if len(raw) < HEADER.size:
        raise ProbeError(f"{what}: truncated BTF ({len(raw)} bytes, a header is {HEADER.size})")
    magic, version, _, hdr_len, type_off, type_len, str_off, str_len = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise ProbeError(f"{what}: not BTF (magic {magic:#06x}, want {MAGIC:#06x})")
    if version != VERSION or hdr_len < HEADER.size:
        raise ProbeError(f"{what}: BTF version {version}, header {hdr_len} bytes: not readable")
    types = (hdr_len + type_off, hdr_len + type_off + type_len)
    strings = (hdr_len + str_off, hdr_len + str_off + str_len)
    if max(types[1], strings[1]) > len(raw):
        raise ProbeError(f"{what}: truncated BTF ({len(raw)} bytes, its header says more)")
    return raw[slice(*types)], raw[slice(*strings)]


def merged(base: bytes, split: bytes, what: str) -> bytes:
    """One standalone BTF of `base` (vmlinux's) and `split` (a module's, over it)."""
    base_types, base_strings = sections(base, "vmlinux")
    split_types, split_strings = sections(split, what)
    types = base_types + split_types
    strings = base_strings + split_strings
    header = HEADER.pack(MAGIC, VERSION, 0, HEADER.size, 0, len(types), len(types), len(strings))
    return header + types + strings


def module(name: str, root: Path = SYSFS) -> bytes:
    """The whole BTF of a loaded module: vmlinux's and the module's from `root`."""
    try:
        base, split = (root / "vmlinux").read_bytes(), (root / name).read_bytes()
    except OSError as err:
        raise ProbeError(f"no BTF of the {name} module ({err.filename}: {err.strerror})") from err
    return merged(base, split, f"{root / name}")
