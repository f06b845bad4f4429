"""What the kernel side offers: the Kernel protocol (what the Probe uses), the Loader protocol
(what PinnedProbe needs of a loader besides), Forwarded and MapKernel (the one implementation of
the reads and the ring buffer every kernel shares), and LoaderBase, what both loaders
(kernel.bcc.BccKernel, kernel.core.CoreKernel) are made from, with the two switches PinnedProbe
sets on them before a load (the gate, and a step between fill and attach)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from kubenpu.discovery import Device
from kubenpu.kernel import abi, bpfsys, hooks
from kubenpu.kernel.maps import Maps
from kubenpu.kernel.records import Durations, Key


class Kernel(Protocol):
    """The loaded BPF program as the Probe uses it; tests/fakes.py has a fake one."""

    aggregate: bool  # built for probe mode `aggregate` (else `events`)
    pinned: bool  # once started: pinned in bpffs, counting on after the agent (PinnedProbe)

    def start(self, on_record: Callable[[bytes], None]) -> str:
        """Load (or adopt) and attach, deliver ring-buffer records to on_record; returns how it
        is attached (hooks.describe). Raises ProbeError."""
        ...

    def poll(self, timeout_ms: int) -> None: ...

    def read_lost(self) -> dict[str, int]:
        """The `lost` slots, cumulative, by abi.LOST_SLOTS name. Raises ProbeError or OSError."""
        ...

    def read_counts(self) -> dict[Key, int]:
        """Aggregate mode's counts map, cumulative. Raises ProbeError or OSError."""
        ...

    def read_remote(self) -> dict[Key, int]:
        """Of each key's calls, those made from a CPU on another NUMA node than the device's
        (docs/placement.md), cumulative, as of the last read_counts (the same snapshot): 0
        where the device has no node. Empty before a read and in events mode."""
        ...

    def read_durations(self) -> dict[Key, Durations]:
        """The `durations` map, cumulative; empty where the program times no call (events
        mode, BCC, no exit to hook). Raises ProbeError or OSError."""
        ...

    def forget_counts(self, keys: Iterable[Key]) -> None:
        """Drop the keys' counts and durations (their cgroup is gone)."""
        ...

    def close(self) -> None: ...


class Loader(Kernel, Protocol):
    """A Kernel that loads a program itself (kernel.bcc.BccKernel, kernel.core.CoreKernel; tests
    use one made of plain maps), as PinnedProbe needs it: its identity, its objects to pin, and
    the two switches set before a load."""

    hook: str
    loader: str
    gate_open: bool
    before_attach: Callable[[], None] | None

    def digest(self) -> str: ...

    def objects(self) -> dict[str, int]: ...

    def shapes(self) -> dict[str, abi.MapShape]:
        """The maps the loader makes, by name: what a pinned probe's must match to be adopted."""
        ...


class Reads(Protocol):
    """The reads of the Kernel protocol: what Maps and every Kernel answer."""

    def read_lost(self) -> dict[str, int]: ...

    def read_counts(self) -> dict[Key, int]: ...

    def read_remote(self) -> dict[Key, int]: ...

    def read_durations(self) -> dict[Key, Durations]: ...

    def forget_counts(self, keys: Iterable[Key]) -> None: ...


class Forwarded:
    """The Kernel protocol's reads, forwarded to `_reads()`: the kernel's Maps, or the kernel
    a wrapper (Fallback, PinnedProbe) uses now."""

    pinned = False  # only a PinnedProbe that pinned or adopted its probe is

    def _reads(self) -> Reads:
        raise NotImplementedError

    def read_lost(self) -> dict[str, int]:
        return self._reads().read_lost()

    def read_counts(self) -> dict[Key, int]:
        return self._reads().read_counts()

    def read_remote(self) -> dict[Key, int]:
        return self._reads().read_remote()

    def read_durations(self) -> dict[Key, Durations]:
        return self._reads().read_durations()

    def forget_counts(self, keys: Iterable[Key]) -> None:
        self._reads().forget_counts(keys)


class MapKernel(Forwarded):
    """A kernel read through its Maps (set by the class) and, where libbpf consumes it
    (CoreKernel, PinnedKernel), its ring buffer."""

    _maps: Maps | None = None
    _ring: bpfsys.RingBuffer | None = None

    def _reads(self) -> Maps:
        return self._maps

    def _open_ring(self, on_record: Callable[[bytes], None]) -> None:
        """Raises bpfsys.BpfError."""
        self._ring = bpfsys.RingBuffer(self._maps.fds[abi.EVENTS], on_record)

    def poll(self, timeout_ms: int) -> None:
        self._ring.poll(timeout_ms)

    def _close_ring(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None


class LoaderBase(MapKernel):
    loader: str  # "bcc" or "core": part of a pinned probe's identity
    times_calls = False  # whether its aggregate program has the durations maps (CO-RE)

    def __init__(
        self,
        devices: Iterable[Device],
        *,
        mode: str = "aggregate",
        hook: str = hooks.DEFAULT_HOOK,
        attach: str = "auto",
        ringbuf_pages: int = 256,
        counts_entries: int = abi.COUNTS_ENTRIES,
    ) -> None:
        self._devices = [d for d in devices if d.vendor]
        self.before_attach: Callable[[], None] | None = None  # runs once the maps are filled
        # False: attach with the gate closed, counting nothing until a hand-over opens it
        # (docs/pinning.md); True: count from the attach on.
        self.gate_open = True
        self.aggregate = mode == "aggregate"
        self.hook = hook
        self._attach = attach
        self._ringbuf_pages = ringbuf_pages
        self._counts_entries = counts_entries
        self._maps: Maps | None = None

    def shapes(self) -> dict[str, abi.MapShape]:
        timed = self.aggregate and self.times_calls
        durations = abi.DURATIONS_ENTRIES if timed else 0
        return abi.map_shapes(self.aggregate, self._ringbuf_pages, self._counts_entries, durations)

    def _fill(self, fds: dict[str, int]) -> None:
        """The loaded program's maps: the device and ioctl tables, and the gate."""
        self._maps = Maps(fds)
        self._maps.fill(self._devices)
        self._maps.set_gate(abi.GATE_OPEN if self.gate_open else abi.GATE_CLOSED)
