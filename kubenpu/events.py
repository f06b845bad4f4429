"""Kernel events: the C `struct event` of bpf/kubenpu.bpf.c, decoded, and their aggregation.

Only this module knows the struct layout. Events are folded at once into counts keyed by
(cgroup id, device, kind), so everything downstream works per distinct key, not per call.
"""

from __future__ import annotations

import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

# u64 ts_ns, u64 cgroup_id, u32 tgid, u32 cmd, u32 major, u32 minor, u32 kind, u32 pad
_EVENT = struct.Struct("<QQIIIIII")
SIZE = _EVENT.size


class Event(NamedTuple):
    ts_ns: int
    cgroup_id: int
    tgid: int
    cmd: int
    major: int
    minor: int
    kind: int


class Key(NamedTuple):
    cgroup_id: int
    major: int
    minor: int
    kind: int


def decode(data: bytes) -> Event:
    return Event(*_EVENT.unpack_from(data)[:7])


# The C `struct birth`: u64 cgroup_id, u64 parent_id. A new cgroup (tp_btf cgroup_mkdir), on the
# same ring buffer as calls and told apart from them by its size.
_BIRTH = struct.Struct("<QQ")


class Birth(NamedTuple):
    cgroup_id: int
    parent_id: int


def route(
    on_call: Callable[[bytes], None], on_birth: Callable[[Birth], None]
) -> Callable[[bytes], None]:
    """One ring-buffer callback that sends birth records to on_birth and calls to on_call."""

    def on_record(data: bytes) -> None:
        if len(data) == _BIRTH.size:
            on_birth(Birth(*_BIRTH.unpack(data)))
        else:
            on_call(data)

    return on_record


@dataclass
class Batch:
    """What a Tally collected since the last drain."""

    counts: Counter[Key] = field(default_factory=Counter)
    overflow: int = 0  # calls whose key did not fit (the agent counts them as `queue_full`)
    received: int = 0  # calls seen, counted or not
    sighted: set[int] = field(default_factory=set)  # cgroup ids announced by first sightings
    events: list[Event] = field(default_factory=list)  # kept only when tracing
    untraced: int = 0  # events not kept because the trace backlog was full


class Tally:
    """Counts per Key, filled by the polling thread and drained by the attribution thread.

    The number of distinct keys is bounded by ``max_keys``, so memory does not grow with the
    call rate or with a flood of new keys.
    """

    def __init__(self, max_keys: int, keep_events: bool = False) -> None:
        self._max_keys = max_keys
        self._keep_events = keep_events
        self._batch = Batch()
        self._lock = threading.Lock()

    def add(self, key: Key, n: int = 1) -> None:
        with self._lock:
            batch = self._batch
            batch.received += n
            if key in batch.counts or len(batch.counts) < self._max_keys:
                batch.counts[key] += n
            else:
                batch.overflow += n

    def add_event(self, data: bytes) -> None:
        """Per-event mode: each ring-buffer record is one call."""
        _, cgroup_id, _, _, major, minor, kind, _ = _EVENT.unpack_from(data)
        self.add(Key(cgroup_id, major, minor, kind))
        if self._keep_events:
            self._keep(decode(data))

    def _keep(self, event: Event) -> None:
        with self._lock:
            batch = self._batch
            if len(batch.events) < self._max_keys:
                batch.events.append(event)
            else:
                batch.untraced += 1

    def add_sighting(self, data: bytes) -> None:
        """Aggregate mode: a record announces a new key; the kernel map holds its count."""
        cgroup_id = _EVENT.unpack_from(data)[1]
        with self._lock:
            self._batch.sighted.add(cgroup_id)

    def drain(self) -> Batch:
        with self._lock:
            batch, self._batch = self._batch, Batch()
        return batch


class Deltas:
    """Turns the kernel's cumulative counts into increments, so one Tally serves both modes."""

    def __init__(self) -> None:
        self._last: dict[Key, int] = {}

    def feed(self, cumulative: dict[Key, int], tally: Tally) -> None:
        for key, total in cumulative.items():
            delta = total - self._last.get(key, 0)
            if delta > 0:
                tally.add(key, delta)
            self._last[key] = total

    def forget(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self._last.pop(key, None)
