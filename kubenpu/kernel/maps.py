"""The probe's maps, by fd, for every loader (BCC, CO-RE, pinned): fill the device and ioctl
tables, set the gate, read the `lost` and `counts` totals (the calls and the remote ones) and
forget counts. One implementation
over bpf(2), whoever loaded the program.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping

from kubenpu.discovery import Device
from kubenpu.kernel import abi, bpfsys
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.records import Durations, Key
from kubenpu.vendors import all_vendors, core

_BATCH = 4096  # keys per BPF_MAP_LOOKUP_BATCH call
_DURATIONS_BATCH = 256


def vendor_ids() -> dict[str, int]:
    """BPF vendor ids: 0 is the DRM core table, plug-ins are numbered from 1."""
    ids = {core().name: abi.VENDOR_CORE}
    ids.update({v.name: i for i, v in enumerate(all_vendors(), start=1)})
    return ids


def tables(devices: Iterable[Device]) -> tuple[dict[int, int], dict[int, int]]:
    """The vendor id of each counted device's nodes (dev_t -> vendor id) and the contents of the
    `ioctls` map (slot -> kind); slots not listed hold 0 (not counted)."""
    ids = vendor_ids()
    devices = [d for d in devices if d.vendor]
    by_node = {
        abi.dev_t(node.major, node.minor): ids[d.vendor] for d in devices for node in d.nodes
    }
    names = {d.vendor for d in devices}
    vendors = (core(), *(v for v in all_vendors() if v.name in names))
    ioctls = {abi.ioctl_index(ids[v.name], i.nr): int(i.kind) for v in vendors for i in v.ioctls}
    return by_node, ioctls


def device_entries(devices: Iterable[Device]) -> dict[int, int]:
    """The device table's values (dev_t -> abi.device_entry: the vendor id and the device's
    NUMA node) of the counted devices."""
    by_node, _ = tables(devices)
    numa = {abi.dev_t(n.major, n.minor): d.numa_node for d in devices for n in d.nodes}
    return {rdev: abi.device_entry(vendor, numa[rdev]) for rdev, vendor in by_node.items()}


Chunk = tuple[bytes, bytes]  # one batch's keys and values, as the kernel left them


def _read_batches(what: str, fd: int, keys: ctypes.Array, values: ctypes.Array) -> list[Chunk]:
    """Every entry of the `what` hash map, len(keys) a BPF_MAP_LOOKUP_BATCH into the caller's
    buffers: each batch's keys and values, copied out as bytes (a read equal to the previous
    one, as at idle, is then found by one comparison, not decoded key by key)."""
    key_size, value_size = ctypes.sizeof(keys) // len(keys), ctypes.sizeof(values) // len(keys)
    raw_keys, raw_values = memoryview(keys).cast("B"), memoryview(values).cast("B")
    token_in, token_out = ctypes.c_uint32(0), ctypes.c_uint32(0)
    chunks: list[Chunk] = []
    first = True
    while True:
        count = ctypes.c_uint32(len(keys))
        try:
            more = bpfsys.lookup_batch(
                fd, None if first else token_in, token_out, keys, values, count
            )
        except bpfsys.BpfError as err:
            raise ProbeError(f"reading the {what} map failed: {err}") from err
        n = count.value
        if n:
            chunks.append(
                (raw_keys[: n * key_size].tobytes(), raw_values[: n * value_size].tobytes())
            )
        if not more or n == 0:
            return chunks
        token_in.value, first = token_out.value, False


class CountsReader:
    """Reads the per-CPU counts map with BPF_MAP_LOOKUP_BATCH into buffers allocated once:
    _BATCH keys a syscall. A read whose bytes equal the previous one's (an idle node's) is not
    decoded again; otherwise the batches are decoded whole (struct, memoryview) and each key's
    Key is made once, not at every read: the read of an idle node with 1,000 pods was mostly
    this decoding (5.7 -> 2.7 ms for 6,000 keys on the host). A read decodes both fields of the
    value: the calls, returned, and the remote ones, kept for `remote()`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._ncpus = bpfsys.possible_cpus()
        self._keys = (abi.CountKey * _BATCH)()
        # one COUNT_VALUE per CPU per key
        self._values = ctypes.create_string_buffer(_BATCH * self._ncpus * abi.COUNT_VALUE.size)
        self._known: dict[tuple[int, int, int], Key] = {}  # the raw key's fields -> its Key
        self._chunks: list[Chunk] = []  # of the last read, and what it decoded to
        self._found: dict[Key, int] = {}
        self._remote: dict[Key, int] = {}

    def read(self) -> dict[Key, int]:
        chunks = _read_batches("counts", self._fd, self._keys, self._values)
        if chunks != self._chunks:
            found: dict[Key, int] = {}
            remote: dict[Key, int] = {}
            for raw_keys, raw_values in chunks:
                self._decode(raw_keys, raw_values, found, remote)
            self._chunks, self._found, self._remote = chunks, found, remote
        return dict(self._found)  # the caller's to change

    def remote(self) -> dict[Key, int]:
        """The remote calls of each key, as of the last read (the same snapshot as its calls)."""
        return dict(self._remote)

    def _decode(
        self, raw_keys: bytes, raw_values: bytes, into: dict[Key, int], remote: dict[Key, int]
    ) -> None:
        known, step = self._known, 2 * self._ncpus  # a key's values: calls, remote per CPU
        values = memoryview(raw_values).cast("Q")
        starts = range(0, len(values), step)
        for raw, i in zip(abi.COUNT_KEY.iter_unpack(raw_keys), starts, strict=True):
            key = known.get(raw)
            if key is None:
                key = known[raw] = Key(raw[0], *abi.split_dev_t(raw[1]), raw[2])
            into[key] = sum(values[i : i + step : 2])
            remote[key] = sum(values[i + 1 : i + step : 2])

    def forget(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self._known.pop((key.cgroup_id, abi.dev_t(key.major, key.minor), key.kind), None)


class DurationsReader:
    """Reads the durations hash in batches, as CountsReader does the counts (a key's listing
    and lookup were two syscalls per key at every read); a read whose bytes equal the previous
    one's is not looked at key by key, and otherwise a value is unpacked only when its bytes
    changed since the previous read. What the previous read held is all it keeps, so a deleted
    key is forgotten at the next read."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        # Fewer keys a batch than the counts: a value is ~1 KB, and the buffer stays allocated.
        self._keys = (abi.CountKey * _DURATIONS_BATCH)()
        self._values = ctypes.create_string_buffer(_DURATIONS_BATCH * abi.DURATION_VALUE.size)
        self._last: dict[bytes, tuple[bytes, Key, Durations]] = {}
        self._chunks: list[Chunk] = []  # of the last read, and what it decoded to
        self._found: dict[Key, Durations] = {}

    def read(self) -> dict[Key, Durations]:
        chunks = _read_batches("durations", self._fd, self._keys, self._values)
        if chunks != self._chunks:
            now: dict[bytes, tuple[bytes, Key, Durations]] = {}
            for raw_keys, raw_values in chunks:
                self._decode(raw_keys, raw_values, now)
            self._last, self._chunks = now, chunks
            self._found = {key: value for _, key, value in now.values()}
        return dict(self._found)  # the caller's to change

    def _decode(
        self, keys: bytes, values: bytes, into: dict[bytes, tuple[bytes, Key, Durations]]
    ) -> None:
        key_size, size = abi.COUNT_KEY.size, abi.DURATION_VALUE.size
        for i in range(len(keys) // key_size):
            raw_key = keys[i * key_size : (i + 1) * key_size]
            raw = values[i * size : (i + 1) * size]
            last = self._last.get(raw_key)
            if last is None or last[0] != raw:
                cgroup_id, rdev, kind = abi.COUNT_KEY.unpack(raw_key)
                key = last[1] if last else Key(cgroup_id, *abi.split_dev_t(rdev), kind)
                last = (raw, key, _durations(raw))
            into[raw_key] = last


def _durations(raw: bytes) -> Durations:
    values = abi.DURATION_VALUE.unpack(raw)
    slots = values[1 : 1 + abi.DURATION_SLOTS]
    return Durations(values[0], slots, values[1 + abi.DURATION_SLOTS :])


def device_slots(entries: dict[int, int]) -> tuple[list[int], dict[int, int]]:
    """The device table split as the kernel reads it: every `minors` slot (the device entry + 1,
    which adds 1 to its vendor id; 0: not counted) and the `devices` hash of the nodes the
    array cannot index."""
    slots = [0] * abi.MINORS_ENTRIES
    others = {}
    for rdev, entry in entries.items():
        index = abi.minor_index(*abi.split_dev_t(rdev))
        if index is None:
            others[rdev] = entry
        else:
            slots[index] = entry + 1
    return slots, others


def empty_devices(fds: Mapping[str, int]) -> None:
    """Make a probe count nothing more (the hand-over): empty its device table. A probe of an
    older layout has only the `devices` hash."""
    if abi.MINORS in fds:
        bpfsys.update_batch(fds[abi.MINORS], range(abi.MINORS_ENTRIES), [0] * abi.MINORS_ENTRIES)
    for key in bpfsys.keys(fds[abi.DEVICES], abi.U32.size):
        bpfsys.delete(fds[abi.DEVICES], key)


class Maps:
    """A loaded probe's maps, by name -> fd (abi.MAPS, plus abi.COUNTS in aggregate mode). The
    caller owns the fds."""

    def __init__(self, fds: Mapping[str, int]) -> None:
        self.fds = fds
        self._ncpus = bpfsys.possible_cpus()
        self._reader: CountsReader | None = None
        self._durations: DurationsReader | None = None

    def fill(self, devices: Iterable[Device]) -> None:
        """Make the device and ioctl tables what discovery found (at load, and at adoption:
        hot-plug, rebinding)."""
        devices = list(devices)
        _, ioctls = tables(devices)
        slots, others = device_slots(device_entries(devices))
        bpfsys.update_batch(self.fds[abi.MINORS], range(abi.MINORS_ENTRIES), slots)
        fd = self.fds[abi.DEVICES]
        wanted = {abi.U32.pack(k): v for k, v in others.items()}
        for key in bpfsys.keys(fd, abi.U32.size):
            if key not in wanted:
                bpfsys.delete(fd, key)
        for key, value in wanted.items():
            bpfsys.update(fd, key, abi.U32.pack(value))
        slots = [ioctls.get(i, 0) for i in range(abi.IOCTL_SLOTS)]
        bpfsys.update_batch(self.fds[abi.IOCTLS], range(abi.IOCTL_SLOTS), slots)

    def set_gate(self, state: int) -> None:
        """The gate's state (abi.GATE_*), keeping its GATE_TIMED bit."""
        timed = self._gate() & abi.GATE_TIMED
        bpfsys.update(self.fds[abi.GATE], abi.U32.pack(0), abi.U32.pack(state | timed))

    def set_timing(self, on: bool) -> None:
        """Whether counted calls are timed (probe.durations), before attach: the gate's
        GATE_TIMED bit, beside its state."""
        value = self._gate() & abi.GATE_STATE | (abi.GATE_TIMED if on else 0)
        bpfsys.update(self.fds[abi.GATE], abi.U32.pack(0), abi.U32.pack(value))

    def _gate(self) -> int:
        found = bpfsys.lookup(self.fds[abi.GATE], abi.U32.pack(0), abi.U32.size)
        return abi.U32.unpack(found)[0] if found else 0  # an array's slot 0 is always found

    def read_lost(self) -> dict[str, int]:
        """The `lost` slots, cumulative, by abi.LOST_SLOTS name; a slot an older program lacks
        reads 0."""
        found = {}
        for i, name in enumerate(abi.LOST_SLOTS):
            raw = bpfsys.lookup(self.fds[abi.LOST], abi.U32.pack(i), abi.U64.size * self._ncpus)
            found[name] = (
                sum(abi.U64.unpack_from(raw, c * 8)[0] for c in range(self._ncpus)) if raw else 0
            )
        return found

    def read_counts(self) -> dict[Key, int]:
        if self._reader is None:
            self._reader = CountsReader(self.fds[abi.COUNTS])
        return self._reader.read()

    def read_remote(self) -> dict[Key, int]:
        """The remote calls of each key as of the last read_counts; empty before one."""
        return {} if self._reader is None else self._reader.remote()

    def read_durations(self) -> dict[Key, Durations]:
        """Every key's durations; empty for a program without the map."""
        fd = self.fds.get(abi.DURATIONS)
        if fd is None:
            return {}
        if self._durations is None:
            self._durations = DurationsReader(fd)
        return self._durations.read()

    def forget_counts(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        if self._reader is not None:
            self._reader.forget(keys)
        fds = [
            self.fds[abi.COUNTS],
            *([self.fds[abi.DURATIONS]] if abi.DURATIONS in self.fds else []),
        ]
        for key in keys:
            packed = abi.COUNT_KEY.pack(key.cgroup_id, abi.dev_t(key.major, key.minor), key.kind)
            for fd in fds:
                bpfsys.delete(fd, packed)
