"""`open_kernel(loaders(...))`: the Kernel the agent uses, from `probe.loader`, `probe.pin_dir`
and the rest of the probe's settings, passed as plain arguments. `auto` loads the CO-RE object
and falls back to BCC when the kernel refuses it, with one log line that says why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from kubenpu.discovery import Device
from kubenpu.kernel import hooks
from kubenpu.kernel.base import Forwarded, Kernel, Loader
from kubenpu.kernel.bcc import BccKernel
from kubenpu.kernel.child import load_in_child
from kubenpu.kernel.core import CoreKernel
from kubenpu.kernel.errors import FINAL, ProbeError
from kubenpu.kernel.pinned import PinnedProbe

log = logging.getLogger(__name__)


class Fallback(Forwarded):
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

    def _reads(self) -> Kernel:
        return self._active

    @property
    def pinned(self) -> bool:
        return self._active.pinned

    def poll(self, timeout_ms: int) -> None:
        self._active.poll(timeout_ms)

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
    durations: bool = True,
    durations_exit: str = "drm_ioctl",
    debug: bool = False,
) -> list[Loader]:
    """The loaders `probe.loader` allows, in the order tried. The kprobe attach exists only in
    BCC, so `attach: kprobe` leaves the CO-RE loader out; only the CO-RE object times calls."""
    sizes = {"mode": mode, "hook": hook, "attach": attach, "ringbuf_pages": ringbuf_pages}
    timing = {"durations": durations, "durations_exit": durations_exit}
    core = CoreKernel(devices, **sizes, alone=loader == "core", **timing)
    bcc = BccKernel(devices, **sizes, debug=debug)
    if loader == "core":
        return [core]
    if loader == "bcc" or attach == "kprobe":
        return [bcc]
    return [core, bcc]


def open_kernel(tried: list[Loader], devices: list[Device], pin_dir: str = "") -> Kernel:
    """The agent's Kernel from loaders() in the order tried: pinned under `pin_dir` when set
    (BCC then compiles in a child process, so the agent never maps LLVM; CO-RE loads in this
    process: libbpf only)."""
    kernels: list[Kernel] = []
    for each in tried:
        if pin_dir:
            spawn = load_in_child if isinstance(each, BccKernel) else None
            kernels.append(PinnedProbe(Path(pin_dir), each, devices, spawn=spawn))
        else:
            kernels.append(each)
    return kernels[0] if len(kernels) == 1 else Fallback(kernels)
