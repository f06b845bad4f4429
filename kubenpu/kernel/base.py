"""What both loaders (kernel.bcc.BccKernel, kernel.core.CoreKernel) are made from, and the two
switches PinnedProbe sets on them before a load (the gate, and a step between fill and attach)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kubenpu.discovery import Device
from kubenpu.kernel import abi, hooks
from kubenpu.kernel.maps import MapReads, Maps


class LoaderBase(MapReads):
    loader: str  # "bcc" or "core": part of a pinned probe's identity

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

    def _fill(self, fds: dict[str, int]) -> None:
        """The loaded program's maps: the device and ioctl tables, and the gate."""
        self._maps = Maps(fds)
        self._maps.fill(self._devices)
        self._maps.set_gate(abi.GATE_OPEN if self.gate_open else abi.GATE_CLOSED)
