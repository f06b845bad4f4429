"""Fakes for what cannot run on the host.

FakeKernel is the fake probe: it stands in for the kernel side (kubenpu/kernel/), the loaded BPF
program, and feeds the real Probe recorded ring-buffer records and kernel map snapshots.
PerCpuBpf holds per-CPU BPF maps as the kernel does, a value on each of more CPUs than this host
may have, for the bpf(2) calls kubenpu/kernel/maps.py makes. FakeResolver answers as the
Resolver does while a CRI lookup is pending (None), for as long as a test says.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Iterable

import pytest

from kubenpu import config
from kubenpu.discovery import Device, not_ignored
from kubenpu.kernel import abi, bpfsys
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.records import Durations
from kubenpu.resolve import Attribution
from kubenpu.resolve.cri import Sandbox
from kubenpu.services import Worker
from kubenpu.sources import registry
from kubenpu.sources.activity import Activity
from kubenpu.sources.base import Node
from kubenpu.sources.calls.attribution import Attributor
from kubenpu.sources.calls.events import KERNEL_LOST, Key

_RECORD = struct.Struct("<QQIIIIII")  # the C struct event, packed independently of kubenpu


def record(key: Key, nr: int = 0xB2, tgid: int = 42, ts_ns: int = 1) -> bytes:
    """A ring-buffer record for one call of `key`, as bpf/kubenpu.bpf.c writes it."""
    cmd = 0xC0206400 | nr
    return _RECORD.pack(ts_ns, key.cgroup_id, tgid, cmd, key.major, key.minor, key.kind, 0)


class Clock:
    """A fake monotonic clock: TTLs, intervals and time-outs are tested without waiting."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def assert_stalls_after(worker: Worker, clock: Clock, seconds: float) -> None:
    """`worker` (started on `clock`, beating no more) is live `seconds` on, the edge itself,
    and stalled by its name half a second past it."""
    clock.now += seconds
    assert worker.broken() is None
    clock.now += 0.5
    assert (worker.broken() or "").startswith(f"worker thread stalled: {worker.name}")


class FakeKernel:
    """A loaded BPF program: `calls()` does what the C side does for kept calls."""

    def __init__(self, aggregate: bool = True, attach: str = "fentry-module") -> None:
        self.aggregate = aggregate
        self.attach = attach
        self.pinned = False
        self.counts: dict[Key, int] = {}  # the counts map, cumulative
        self.remote: dict[Key, int] = {}  # of them, the calls from another NUMA node
        self._remote_read: dict[Key, int] = {}  # `remote` as of the last read_counts
        self.durations: dict[Key, Durations] = {}  # the durations map, cumulative
        self.lost = dict.fromkeys(KERNEL_LOST, 0)  # the lost array, cumulative
        self.start_raises: Exception | None = None
        self.failing_reads = 0  # the next N reads raise ProbeError
        self.poll_raises: BaseException | None = None  # the next poll raises this
        # The next poll delivers this many records, then raises poll_raises; the records not
        # consumed stay in the ring for the next poll, as ring_buffer__poll leaves them.
        self.poll_fails_after: int | None = None
        self.forgotten: list[Key] = []
        self.closed = False
        self._records: list[bytes] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._on_record: Callable[[bytes], None] | None = None

    def start(self, on_record: Callable[[bytes], None]) -> str:
        if self.start_raises is not None:
            raise self.start_raises
        self._on_record = on_record
        return self.attach

    def calls(self, key: Key, n: int = 1, remote: int = 0) -> None:
        """n calls of `key`, `remote` of them from another NUMA node than the device's:
        per-call records in events mode; map counts and one first sighting in aggregate
        mode."""
        assert 0 <= remote <= n, "the kernel counts a remote call among the calls"
        if not self.aggregate:
            self.emit(*[record(key)] * n)
            return
        first = key not in self.counts
        self.counts[key] = self.counts.get(key, 0) + n
        self.remote[key] = self.remote.get(key, 0) + remote
        if first:
            self.emit(record(key))

    def timed(self, key: Key, nanoseconds: Iterable[int], ret: int = 0) -> None:
        """Calls of `key` that returned `ret` after these durations, as the exit program adds
        them to `durations` (its bucket math is abi.duration_slot's)."""
        old = self.durations.get(key) or Durations(
            0, (0,) * abi.DURATION_SLOTS, (0,) * len(abi.ERRORS)
        )
        slots, errors, total = list(old.slots), list(old.errors), old.sum_ns
        for ns in nanoseconds:
            slots[abi.duration_slot(ns)] += 1
            total += ns
            if (slot := abi.error_slot(ret)) is not None:
                errors[slot] += 1
        self.durations[key] = Durations(total, tuple(slots), tuple(errors))

    def emit(self, *records: bytes) -> None:
        """Raw records into the ring buffer, whatever they hold."""
        with self._lock:
            self._records.extend(records)
        self._wake.set()

    def poll(self, timeout_ms: int) -> None:
        exc, after = self.poll_raises, self.poll_fails_after
        if exc is not None and after is None:
            self.poll_raises = None
            raise exc
        self._wake.wait(timeout_ms / 1000)
        with self._lock:
            take = len(self._records) if exc is None else min(after or 0, len(self._records))
            records, self._records = self._records[:take], self._records[take:]
            if not self._records:
                self._wake.clear()
        for data in records:
            self._on_record(data)
        if exc is not None:
            self.poll_raises = self.poll_fails_after = None
            raise exc

    def _read(self, what: dict) -> dict:
        if self.failing_reads:
            self.failing_reads -= 1
            raise ProbeError("reading the counts map failed: Bad address")
        return dict(what)

    def read_lost(self) -> dict[str, int]:
        return self._read(self.lost)

    def read_counts(self) -> dict[Key, int]:
        counts = self._read(self.counts)
        self._remote_read = dict(self.remote)  # one snapshot, as the map's value holds both
        return counts

    def read_remote(self) -> dict[Key, int]:
        return dict(self._remote_read)

    def read_durations(self) -> dict[Key, Durations]:
        return self._read(self.durations)

    def forget_counts(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.forgotten.append(key)
            self.counts.pop(key, None)
            self.remote.pop(key, None)
            self._remote_read.pop(key, None)
            self.durations.pop(key, None)

    def close(self) -> None:
        self.closed = True


class PerCpuBpf:
    """Per-CPU maps (fd -> key bytes -> each CPU's fields, u64s) behind bpfsys's possible_cpus,
    lookup and lookup_batch, as strict as the kernel: every value is spread over `ncpus` CPUs
    (6, more than this host's 2), so a reader of one CPU's slot, or of as many as the host has,
    reads less; a buffer smaller than the kernel writes (the value's size per CPU per key) fails
    the test. `lost` holds one u64 a CPU, `counts` two (abi.COUNT_VALUE: calls, remote)."""

    def __init__(self, ncpus: int = 6) -> None:
        self.ncpus = ncpus
        self.maps: dict[int, dict[bytes, list[list[int]]]] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(bpfsys, "possible_cpus", lambda: self.ncpus)
        monkeypatch.setattr(bpfsys, "lookup", self.lookup)
        monkeypatch.setattr(bpfsys, "lookup_batch", self.lookup_batch)

    def add(self, fd: int, key: bytes, *n: int) -> None:
        """n more on each field of key, as programs on every CPU leave them: CPU c gets its
        share of each (one field for `lost`, calls and remote for `counts`)."""
        slots = self.maps.setdefault(fd, {}).setdefault(key, [[0] * len(n)] * self.ncpus)
        self.maps[fd][key] = [
            [old + x // self.ncpus + (cpu < x % self.ncpus) for old, x in zip(s, n, strict=True)]
            for cpu, s in enumerate(slots)
        ]

    def lookup(self, fd: int, key: bytes, value_size: int) -> bytes | None:
        slots = self.maps.get(fd, {}).get(key)
        if slots is None:
            return None
        assert value_size >= 8 * len(slots[0]) * self.ncpus, "the kernel writes every CPU's"
        return b"".join(struct.pack(f"={len(s)}Q", *s) for s in slots)

    def lookup_batch(self, fd, token_in, token_out, keys, values, count) -> bool:  # type: ignore[no-untyped-def]
        """BPF_MAP_LOOKUP_BATCH: up to count keys from token_in on, values key after key, each
        its fields for every CPU; False with the last batch (the kernel's ENOENT)."""
        room = count.value
        items = sorted(self.maps.get(fd, {}).items())
        start = 0 if token_in is None else token_in.value
        if token_in is not None and start >= len(items):
            return False  # past the last bucket: ENOENT at once, count left as it was passed
        chunk = items[start : start + room]
        width = 8 * self.ncpus * (len(chunk[0][1][0]) if chunk else 1)
        assert len(keys) >= room and ctypes.sizeof(values) >= room * width, "buffers too small"
        for i, (key, slots) in enumerate(chunk):
            keys[i] = abi.CountKey.from_buffer_copy(key)
            raw = b"".join(struct.pack(f"={len(s)}Q", *s) for s in slots)
            ctypes.memmove(ctypes.addressof(values) + i * width, raw, width)
        count.value = len(chunk)
        token_out.value = start + len(chunk)
        return start + len(chunk) < len(items)


class FakeResolver:
    """Answers from `answers`; a cgroup without one is pending (None) until settle()."""

    def __init__(self, settled: Attribution | None = None) -> None:
        self.answers: dict[int, Attribution] = {}
        self.dead: set[int] = set()
        self.raises: BaseException | None = None  # the next resolve() raises this
        self.settled = settled or Attribution(reason="cri_error")
        self.forgotten: list[int] = []
        self.paths: dict[int, str] = {}  # cgroup id -> its directory
        self.closed = False

    def resolve(self, cgroup_id: int) -> Attribution | None:
        if (exc := self.raises) is not None:
            self.raises = None
            raise exc
        return self.answers.get(cgroup_id)

    def prefetch(self, cgroup_ids: Iterable[int]) -> None:
        pass  # no cgroup tree to walk

    def settle(self, cgroup_id: int) -> Attribution:
        return self.answers.get(cgroup_id, self.settled)

    def alive(self, cgroup_id: int) -> bool:
        return cgroup_id not in self.dead

    def path(self, cgroup_id: int) -> str | None:
        return self.paths.get(cgroup_id)

    def removed(self) -> bool:
        return True  # no tree to watch: every reap checks every cgroup

    def forget(self, cgroup_id: int) -> None:
        self.forgotten.append(cgroup_id)

    def runtime_version(self) -> str | None:
        return "fake 1.0"

    def pod_uids(self) -> dict[tuple[str, str], str] | None:
        return None  # a runtime that does not answer: the allocation series get no uid

    def sandboxes(self) -> dict[tuple[str, str], Sandbox] | None:
        return None  # a runtime that does not answer: the guard names no pod

    def close(self) -> None:
        self.closed = True


def fake_node(cfg: config.Config, found: list[Device]) -> Node:
    """A Node as wiring.start builds it, on a fresh series table and a FakeResolver: what a
    source's build() is given."""
    table, resolver = registry.table(300, 1000), FakeResolver()
    return Node(
        cfg,
        table,
        found,
        not_ignored(found, ()),
        resolver,
        Attributor(found, resolver, table),
        activity=Activity(300),
    )
