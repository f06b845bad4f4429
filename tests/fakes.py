"""Fakes for what cannot run on the host.

FakeKernel is the fake probe: it stands in for the kernel side (kubenpu/kernel/), the loaded BPF
program, and feeds the real Probe recorded ring-buffer records and kernel map snapshots.
FakeResolver answers as the Resolver does while a CRI lookup is pending (None), for as long as a
test says.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable

from kubenpu.events import KERNEL_LOST, Key
from kubenpu.kernel.errors import ProbeError
from kubenpu.resolve import Attribution

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


class FakeKernel:
    """A loaded BPF program: `calls()` does what the C side does for kept calls."""

    def __init__(self, aggregate: bool = True, attach: str = "fentry-module") -> None:
        self.aggregate = aggregate
        self.attach = attach
        self.counts: dict[Key, int] = {}  # the counts map, cumulative
        self.lost = dict.fromkeys(KERNEL_LOST, 0)  # the lost array, cumulative
        self.start_raises: Exception | None = None
        self.failing_reads = 0  # the next N reads raise ProbeError
        self.poll_raises: BaseException | None = None  # the next poll raises this
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

    def calls(self, key: Key, n: int = 1) -> None:
        """n calls of `key`: per-call records in events mode; map counts and one first
        sighting in aggregate mode."""
        if not self.aggregate:
            self.emit(*[record(key)] * n)
            return
        first = key not in self.counts
        self.counts[key] = self.counts.get(key, 0) + n
        if first:
            self.emit(record(key))

    def emit(self, *records: bytes) -> None:
        """Raw records into the ring buffer, whatever they hold."""
        with self._lock:
            self._records.extend(records)
        self._wake.set()

    def poll(self, timeout_ms: int) -> None:
        if (exc := self.poll_raises) is not None:
            self.poll_raises = None
            raise exc
        self._wake.wait(timeout_ms / 1000)
        with self._lock:
            records, self._records = self._records, []
            self._wake.clear()
        for data in records:
            self._on_record(data)

    def _read(self, what: dict) -> dict:
        if self.failing_reads:
            self.failing_reads -= 1
            raise ProbeError("reading the counts map failed: Bad address")
        return dict(what)

    def read_lost(self) -> dict[str, int]:
        return self._read(self.lost)

    def read_counts(self) -> dict[Key, int]:
        return self._read(self.counts)

    def forget_counts(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self.forgotten.append(key)
            self.counts.pop(key, None)

    def close(self) -> None:
        self.closed = True


class FakeResolver:
    """Answers from `answers`; a cgroup without one is pending (None) until settle()."""

    def __init__(self, settled: Attribution | None = None) -> None:
        self.answers: dict[int, Attribution] = {}
        self.dead: set[int] = set()
        self.raises: BaseException | None = None  # the next resolve() raises this
        self.settled = settled or Attribution(reason="cri_error")
        self.forgotten: list[int] = []
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

    def forget(self, cgroup_id: int) -> None:
        self.forgotten.append(cgroup_id)

    def runtime_version(self) -> str | None:
        return "fake 1.0"

    def close(self) -> None:
        self.closed = True
