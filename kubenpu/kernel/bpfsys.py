"""A light layer over the bpf(2) syscall and libbpf's ring buffer, through ctypes.

What an agent needs to use BPF objects that are already loaded and pinned in bpffs: open a
pinned object, pin one, read and write map entries, list loaded programs, and poll a ring buffer.
It imports neither BCC nor LLVM, so a process that only adopts pinned objects stays small.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from kubenpu.kernel import abi

# bpf(2) command numbers (include/uapi/linux/bpf.h)
_MAP_CREATE = 0
_MAP_LOOKUP_ELEM = 1
_MAP_UPDATE_ELEM = 2
_MAP_DELETE_ELEM = 3
_MAP_GET_NEXT_KEY = 4
_OBJ_PIN = 6
_OBJ_GET = 7
_PROG_GET_NEXT_ID = 11
_PROG_GET_FD_BY_ID = 13
_OBJ_GET_INFO_BY_FD = 15
_MAP_LOOKUP_BATCH = 24
_MAP_UPDATE_BATCH = 26
_ATTR_SIZE = 128  # larger than every attr used here; the kernel checks the tail is zero
_SYSCALL = {"x86_64": 321, "aarch64": 280}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class BpfError(OSError):
    """A bpf(2) call failed; errno and a one-line message."""


def _bpf(cmd: int, attr: ctypes.Array, what: str) -> int:
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise BpfError(0, f"bpf(2) syscall number unknown on {platform.machine()}")
    res = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(cmd), attr, ctypes.c_uint(len(attr)))
    if res < 0:
        err = ctypes.get_errno()
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return res


def _attr(fmt: str, *values: int) -> ctypes.Array:
    buf = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into(fmt, buf, 0, *values)
    return buf


def _addr(obj) -> int:
    return ctypes.addressof(obj) if obj is not None else 0


def obj_get(path: Path) -> int:
    """An fd for the object pinned at `path`."""
    name = ctypes.create_string_buffer(os.fsencode(path))
    return _bpf(_OBJ_GET, _attr("=QII", _addr(name), 0, 0), f"opening {path}")


def obj_pin(fd: int, path: Path) -> None:
    name = ctypes.create_string_buffer(os.fsencode(path))
    _bpf(_OBJ_PIN, _attr("=QII", _addr(name), fd, 0), f"pinning {path}")


def map_create(map_type: int, key_size: int, value_size: int, max_entries: int, name: str) -> int:
    """A new map's fd."""
    attr = _attr("=7I16s", map_type, key_size, value_size, max_entries, 0, 0, 0, name.encode()[:15])
    return _bpf(_MAP_CREATE, attr, f"creating map {name}")


def array_create(name: str, value: bytes) -> int:
    """A one-entry array map holding `value` (how a small record lives in bpffs); its fd."""
    fd = map_create(abi.MAP_TYPE_ARRAY, 4, len(value), 1, name)
    update(fd, struct.pack("=I", 0), value)
    return fd


def lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    """The value of `key`, or None when absent."""
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value_size)
    try:
        _bpf(_MAP_LOOKUP_ELEM, _attr("=IIQQQ", fd, 0, _addr(k), _addr(v), 0), "map lookup")
    except BpfError as err:
        if err.errno == 2:  # ENOENT
            return None
        raise
    return v.raw


def update(fd: int, key: bytes, value: bytes) -> None:
    k = ctypes.create_string_buffer(key, len(key))
    v = ctypes.create_string_buffer(value, len(value))
    _bpf(_MAP_UPDATE_ELEM, _attr("=IIQQQ", fd, 0, _addr(k), _addr(v), 0), "map update")


def delete(fd: int, key: bytes) -> bool:
    """False when the key was absent."""
    k = ctypes.create_string_buffer(key, len(key))
    try:
        _bpf(_MAP_DELETE_ELEM, _attr("=IIQQQ", fd, 0, _addr(k), 0, 0), "map delete")
    except BpfError as err:
        if err.errno == 2:
            return False
        raise
    return True


def keys(fd: int, key_size: int) -> list[bytes]:
    """Every key of a (small) map."""
    found: list[bytes] = []
    nxt = ctypes.create_string_buffer(key_size)
    while True:
        cur = ctypes.create_string_buffer(found[-1], key_size) if found else None
        attr = _attr("=IIQQ", fd, 0, _addr(cur), _addr(nxt))
        try:
            _bpf(_MAP_GET_NEXT_KEY, attr, "listing map keys")
        except BpfError as err:
            if err.errno == 2:
                return found
            raise
        found.append(nxt.raw)


def lookup_batch(fd: int, token_in, token_out, keys, values, count: ctypes.c_uint32) -> bool:
    """One BPF_MAP_LOOKUP_BATCH into caller-owned buffers; `count` in: room, out: found.
    False when this was the last batch (ENOENT)."""
    attr = _attr(
        "=QQQQIIQQ",
        _addr(token_in),
        _addr(token_out),
        _addr(keys),
        _addr(values),
        count.value,
        fd,
        0,
        0,
    )
    try:
        _bpf(_MAP_LOOKUP_BATCH, attr, "reading a map")
    except BpfError as err:
        if err.errno != 2:
            raise
        count.value = struct.unpack_from("=I", attr, 32)[0]
        return False
    count.value = struct.unpack_from("=I", attr, 32)[0]
    return True


def update_batch(fd: int, keys: Iterable[int], values: Iterable[int]) -> None:
    """Write u32 `values` at u32 `keys` in one BPF_MAP_UPDATE_BATCH (an array's every slot in
    one syscall, where one update each would cost thousands)."""
    k = list(keys)
    key_buf = (ctypes.c_uint32 * len(k))(*k)
    value_buf = (ctypes.c_uint32 * len(k))(*values)
    count = ctypes.c_uint32(len(k))
    attr = _attr("=QQQQIIQQ", 0, 0, _addr(key_buf), _addr(value_buf), count.value, fd, 0, 0)
    _bpf(_MAP_UPDATE_BATCH, attr, "writing a map")


def possible_cpus() -> int:
    """How many per-CPU slots a per-CPU map value has (the kernel's possible CPUs)."""
    text = Path("/sys/devices/system/cpu/possible").read_text().strip()
    total = 0
    for part in text.split(","):
        first, _, last = part.partition("-")
        total += int(last or first) - int(first) + 1
    return total


def map_shape(fd: int) -> abi.MapShape:
    """A map's type, key and value sizes and entries (the head of struct bpf_map_info)."""
    info = ctypes.create_string_buffer(80)
    _bpf(_OBJ_GET_INFO_BY_FD, _attr("=IIQ", fd, len(info), _addr(info)), "map info")
    map_type, _id, key_size, value_size, max_entries = struct.unpack_from("=5I", info)
    return abi.MapShape(map_type, key_size, value_size, max_entries)


def program_names() -> Iterator[str]:
    """The names of every loaded BPF program (15 characters at most)."""
    prog_id = 0
    while True:
        attr = _attr("=III", prog_id, 0, 0)
        try:
            _bpf(_PROG_GET_NEXT_ID, attr, "listing programs")
        except BpfError as err:
            if err.errno == 2:
                return
            raise
        prog_id = struct.unpack_from("=I", attr, 4)[0]
        try:
            fd = _bpf(_PROG_GET_FD_BY_ID, _attr("=III", prog_id, 0, 0), "opening a program")
        except BpfError:
            continue  # unloaded meanwhile
        try:
            info = ctypes.create_string_buffer(256)
            _bpf(_OBJ_GET_INFO_BY_FD, _attr("=IIQ", fd, len(info), _addr(info)), "prog info")
            yield info.raw[64:80].split(b"\0")[0].decode(errors="replace")  # bpf_prog_info.name
        finally:
            os.close(fd)


_SAMPLE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_RING_BUFFER = ("ring_buffer__new", "ring_buffer__poll", "ring_buffer__free")
# libbpf's own error codes (libbpf.h, enum libbpf_errno), returned negated like an errno, which
# os.strerror calls "Unknown error 4001".
_LIBBPF_ERRNO = {
    4000: ("LIBBPF_ERRNO__LIBELF", "something wrong in libelf"),
    4001: ("LIBBPF_ERRNO__FORMAT", "BPF object format invalid"),
    4002: ("LIBBPF_ERRNO__KVERSION", "incorrect or no 'version' section"),
    4003: ("LIBBPF_ERRNO__ENDIAN", "endian mismatch"),
    4004: ("LIBBPF_ERRNO__INTERNAL", "internal error in libbpf"),
    4005: ("LIBBPF_ERRNO__RELOC", "relocation failed"),
    4006: ("LIBBPF_ERRNO__LOAD", "load program failure for unknown reason"),
    4007: ("LIBBPF_ERRNO__VERIFY", "kernel verifier blocks program loading"),
    4008: ("LIBBPF_ERRNO__PROG2BIG", "program too big"),
    4009: ("LIBBPF_ERRNO__KVER", "incorrect kernel version"),
    4010: ("LIBBPF_ERRNO__PROGTYPE", "kernel doesn't support this program type"),
    4011: ("LIBBPF_ERRNO__WRNGPID", "wrong pid in netlink message"),
    4012: ("LIBBPF_ERRNO__INVSEQ", "invalid netlink sequence"),
    4013: ("LIBBPF_ERRNO__NLPARSE", "netlink parsing error"),
}


def error_name(err: int) -> str:
    """A libbpf return code or an errno (either sign) by its name and in words."""
    code = abs(err)
    if code in _LIBBPF_ERRNO:
        name, what = _LIBBPF_ERRNO[code]
        return f"{name}: {what}"
    return f"{errno.errorcode.get(code, str(code))}: {os.strerror(code)}"


class MissingSymbols(OSError):
    """The libbpf.so.1 found lacks functions the caller needs (an old or a stripped build)."""


def libbpf(needed: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The system's libbpf (the one BCC links against), by soname: ctypes.util.find_library would
    run ldconfig at every start. OSError when it is missing, MissingSymbols when it lacks one of
    `needed`."""
    lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    if missing := [name for name in needed if not hasattr(lib, name)]:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise MissingSymbols(f"{_loaded('libbpf.so.1')} lacks {', '.join(missing[:3])}{more}")
    return lib


def _loaded(soname: str) -> str:
    """The file the dynamic loader mapped for `soname` (else the soname)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if soname in line}
    except OSError:
        return soname
    return min(paths, default=soname)


class RingBuffer:
    """A BPF ring buffer map, consumed with the system's libbpf (ring_buffer__new/poll)."""

    def __init__(self, map_fd: int, on_record: Callable[[bytes], None]) -> None:
        try:
            self._lib = libbpf(_RING_BUFFER)
        except OSError as err:
            raise BpfError(0, f"libbpf is needed to read the ring buffer: {err}") from err
        self._lib.ring_buffer__new.restype = ctypes.c_void_p
        self._lib.ring_buffer__new.argtypes = [
            ctypes.c_int,
            _SAMPLE,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        self._lib.ring_buffer__poll.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self._lib.ring_buffer__free.argtypes = [ctypes.c_void_p]

        def sample(_ctx, data, size) -> int:
            on_record(ctypes.string_at(data, size))
            return 0

        self._sample = _SAMPLE(sample)  # kept: libbpf holds only the pointer
        self._rb = self._lib.ring_buffer__new(map_fd, self._sample, None, None)
        if not self._rb:
            raise BpfError(ctypes.get_errno(), "opening the ring buffer failed")

    def poll(self, timeout_ms: int) -> None:
        res = self._lib.ring_buffer__poll(self._rb, timeout_ms)
        if res < 0 and -res != 4:  # EINTR: a signal, the next poll goes on
            raise BpfError(-res, f"polling the ring buffer: {os.strerror(-res)}")

    def close(self) -> None:
        if self._rb:
            self._lib.ring_buffer__free(self._rb)
            self._rb = None
