"""`open_kernel()`: the Kernel the agent uses, from `probe.loader`, `probe.pin_dir` and the rest
of the probe's config. `auto` loads the CO-RE object and falls back to BCC when the kernel
refuses it, with one log line that says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from kubenpu.discovery import Device
from kubenpu.kernel import hooks
from kubenpu.kernel.base import Kernel, Loader
from kubenpu.kernel.bcc import BccKernel
from kubenpu.kernel.child import load_in_child
from kubenpu.kernel.core import CoreKernel
from kubenpu.kernel.errors import FINAL, ProbeError
from kubenpu.kernel.pinned import PinnedProbe
from kubenpu.kernel.records import Key

log = logging.getLogger(__name__)


class Fallback:
    """`probe.loader: auto`: the first kernel that starts, in order (CO-RE, then BCC)."""

    def __init__(self, kernels: list[Kernel]) -> None:
        self._kernels = kernels
        self._active = kernels[0]
        self.aggregate = kernels[0].aggregate

    def start(self, on_record: Callable[[bytes], None]) -> str:
        """The first kernel's failure, its cause first, ends the line: the next kernel is not
        tried where its cause is one no loader gets past (capabilities), and its own failure
        follows the first one's."""
        *first, last = self._kernels
        failed: list[ProbeError] = []
        for kernel in first:
            try:
                self._active = kernel
                return kernel.start(on_record)
            except ProbeError as err:
                if err.cause in FINAL:
                    raise
                log.warning("the CO-RE object did not load, falling back to BCC: %s", err)
                failed.append(err)
        self._active = last
        try:
            return last.start(on_record)
        except ProbeError as err:
            if not failed:
                raise
            said = str(err).partition(": ")[2]  # without its own "cannot attach to HOOK"
            raise ProbeError(f"{failed[0]}; BCC fallback: {said}", failed[0].cause) from err

    def poll(self, timeout_ms: int) -> None:
        self._active.poll(timeout_ms)

    def read_lost(self) -> dict[str, int]:
        return self._active.read_lost()

    def read_counts(self) -> dict[Key, int]:
        return self._active.read_counts()

    def forget_counts(self, keys: Iterable[Key]) -> None:
        self._active.forget_counts(keys)

    def close(self) -> None:
        self._active.close()


def loaders(
    devices: list[Device],
    *,
    loader: str = "auto",
    mode: str = "aggregate",
    hook: str = hooks.DEFAULT_HOOK,
    attach: str = "auto",
    ringbuf_pages: int = 256,
    debug: bool = False,
) -> list[Loader]:
    """The loaders `probe.loader` allows, in the order tried. The kprobe attach exists only in
    BCC, so `attach: kprobe` leaves the CO-RE loader out."""
    sizes = {"mode": mode, "hook": hook, "attach": attach, "ringbuf_pages": ringbuf_pages}
    core = CoreKernel(devices, **sizes, alone=loader == "core")
    bcc = BccKernel(devices, **sizes, debug=debug)
    if loader == "core":
        return [core]
    if loader == "bcc" or attach == "kprobe":
        return [bcc]
    return [core, bcc]


def open_kernel(
    devices: list[Device],
    *,
    pin_dir: str = "",
    loader: str = "auto",
    mode: str = "aggregate",
    hook: str = hooks.DEFAULT_HOOK,
    attach: str = "auto",
    ringbuf_pages: int = 256,
    debug: bool = False,
) -> Kernel:
    """The agent's Kernel, from the `probe.*` settings: pinned under `pin_dir` when set (BCC then
    compiles in a child process, so the agent never maps LLVM; CO-RE loads in this process:
    libbpf only)."""
    kernels: list[Kernel] = []
    tried = loaders(
        devices,
        loader=loader,
        mode=mode,
        hook=hook,
        attach=attach,
        ringbuf_pages=ringbuf_pages,
        debug=debug,
    )
    for each in tried:
        if pin_dir:
            spawn = load_in_child if isinstance(each, BccKernel) else None
            kernels.append(PinnedProbe(Path(pin_dir), each, devices, spawn=spawn))
        else:
            kernels.append(each)
    return kernels[0] if len(kernels) == 1 else Fallback(kernels)
