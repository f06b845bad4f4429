"""The kernel side pinned in bpffs, so it outlives the agent (docs/pinning.md).

`PinnedProbe` is the Kernel the agent uses when `probe.pin_dir` is set. At start it either
- adopts the probe pinned under ``pin_dir/<identity>/`` (same agent version, program digest,
  kernel release, hook and mode): it opens the pinned maps with BPF_OBJ_GET, refreshes the
  device and ioctl tables from discovery and reads on; no BCC, no compile, no attach; or
- has a short-lived child process compile, load, attach and pin a new probe (`load_in_child`),
  then adopts that, so the agent's own process never maps BCC or LLVM.
Either way it then hands over from every other pinned probe (`PinnedProbe._hand_over`, the gate
protocol of docs/pinning.md) and adds the frozen totals of the retired ones to its own.

A pin directory is complete once its `meta` map exists (it is pinned last) and every link it
lists is pinned; an incomplete one, left by a crash while pinning, is set aside as retired.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

from kubenpu import __version__
from kubenpu.discovery import Device
from kubenpu.kernel import bpfsys
from kubenpu.kernel.abi import GATE_HANDOVER, GATE_OPEN
from kubenpu.kernel.base import Forwarded, Loader
from kubenpu.kernel.child import Spawn
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.maps import Maps, empty_devices
from kubenpu.kernel.pins import (
    BIRTHS_LINK,
    META,
    RETIRED,
    Incompatible,
    PinnedKernel,
    detach,
    device_table,
    links,
    on_bpffs,
    pin_objects,
    unpin,
)
from kubenpu.kernel.records import Key

log = logging.getLogger(__name__)


class PinnedProbe(Forwarded):
    """The agent's Kernel with `probe.pin_dir` set: adopts a matching pinned probe, or has one
    loaded and pinned (by `spawn`, in a child; without it in this process), then hands over
    from every other pinned probe."""

    def __init__(
        self, root: Path, loader: Loader, devices: Iterable[Device], spawn: Spawn | None = None
    ) -> None:
        self._root = root
        self._devices = list(devices)
        self._loader = loader
        self._spawn = spawn
        self.aggregate = loader.aggregate
        self._active: PinnedKernel | Loader = self._loader
        self._inherited_counts: Counter[Key] = Counter()
        self._inherited_remote: Counter[Key] = Counter()
        self._inherited_lost: Counter[str] = Counter()
        self._retired: list[PinnedKernel] = []  # kept open: their keys are forgotten too

    @functools.cached_property
    def meta(self) -> dict:
        """The identity's fields, known before loading. Computed when first needed, not at
        construction: under `probe.loader: auto` the BCC fallback's digest (its source texts and
        a scan of kallsyms) is computed only if the CO-RE object is refused."""
        return {
            "version": __version__,
            "program": self._loader.digest(),
            "kernel": os.uname().release,
            "hook": self._loader.hook,
            "mode": "aggregate" if self._loader.aggregate else "events",
            "loader": self._loader.loader,
        }

    @functools.cached_property
    def dir(self) -> Path:
        """The directory's name is the identity: an agent finds its own probe by name."""
        ident = hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode()).hexdigest()
        return self._root / ident[:16]

    def start(self, on_record: Callable[[bytes], None]) -> str:
        if not self.aggregate:
            # Events mode (per-call records, --trace) keeps its counts in the process, so there
            # is nothing worth pinning. It still detaches pinned probes, so that one program
            # counts, and leaves their totals pinned for the next aggregate-mode agent.
            self._loader.before_attach = self._detach_others
            return self._loader.start(on_record)
        if not on_bpffs(self._root):
            log.warning(
                "no bpffs at %s: loading the probe in this process, unpinned "
                "(counting stops with the agent)",
                self._root,
            )
            return self._loader.start(on_record)
        attach = self._adopt(on_record) or self._load(on_record)
        self._take_over_retired()
        return attach

    def _load(self, on_record: Callable[[bytes], None]) -> str:
        """A new probe of this agent's identity, pinned and in use; returns the attach."""
        if self.dir.exists():
            self._set_aside(self.dir)
        # Closed while another pinned probe still counts; _hand_over opens it.
        self._loader.gate_open = not any(links(other) for other in self._others())
        if self._spawn is not None and self._spawn(self._loader, self.dir, self.meta):
            attach = self._adopt(on_record, loaded=True)
            if attach is not None:
                return attach
            if self.dir.exists():
                self._set_aside(self.dir)
        # In this process: CO-RE (libbpf only), or BCC without a child (then LLVM stays mapped).
        attach = self._loader.start(on_record)
        objects = self._loader.objects()
        pinned = self.pinned = pin_objects(objects, self.dir, dict(self.meta, attach=attach))
        self._hand_over(Maps(objects).set_gate)
        return f"{attach} (pinned in {self.dir})" if pinned else attach

    def _adopt(self, on_record: Callable[[bytes], None], loaded: bool = False) -> str | None:
        """The attach of this agent's own pinned probe, now in use; None if there is none."""
        if not (self.dir / META).exists():
            return None
        adopted = None
        try:
            adopted = PinnedKernel(self.dir, self._loader.shapes())
            if not adopted.complete():
                adopted.close()
                return None  # detached or half pinned: not adoptable
            attach = adopted.start(on_record, self._devices)
            self._hand_over(adopted.set_gate)
        except Incompatible as err:
            adopted.close()
            log.warning("pinned probe %s is not this program's, handing over: %s", self.dir, err)
            self._retire(self.dir)  # still counting: the new load hands over from it
            return None
        except (bpfsys.BpfError, KeyError, ValueError) as err:
            if adopted is not None:
                adopted.close()
            log.warning("pinned probe %s unusable, loading anew: %s", self.dir, err)
            return None
        self._active = adopted
        self.pinned = True
        if BIRTHS_LINK not in adopted.meta["links"]:
            log.warning("cgroup births unavailable: short-lived containers may lose their pod")
        if loaded:
            log.info("adopted the probe the loader process pinned in %s", self.dir)
            return f"{attach} (loaded by a child process, pinned in {self.dir})"
        log.info("adopted the pinned probe %s (no compile, no attach)", self.dir)
        return f"{attach} (adopted from {self.dir})"

    def _hand_over(self, set_gate: Callable[[int], None]) -> None:
        """Take over counting from every other attached pinned probe (docs/pinning.md): with
        this probe's gate at hand-over (it counts what it sees as `handover` drops), empty their
        device tables (they stop counting), open the gate, then detach them. The window is a few
        map updates long; a call in it is counted once, or reported as a handover drop."""
        attached = [other for other in self._others() if links(other)]
        tables = [t for t in map(device_table, attached) if t is not None]
        try:
            if attached:
                set_gate(GATE_HANDOVER)
                for fds in tables:
                    empty_devices(fds)
            set_gate(GATE_OPEN)
        finally:
            for fds in tables:
                for fd in fds.values():
                    os.close(fd)
        for other in attached:
            log.info("handed over from the pinned probe %s", other)
            detach(other)

    def _set_aside(self, probe_dir: Path) -> None:
        """This agent's own directory, unusable (a crash while pinning): detach it and keep
        its totals under another name, as a retired probe."""
        detach(probe_dir)
        self._retire(probe_dir)

    @staticmethod
    def _retire(probe_dir: Path) -> None:
        """Keep a probe's pins under another name, as a retired probe, attached or not."""
        aside = probe_dir.with_name(f"{probe_dir.name}{RETIRED}{time.time_ns()}")
        aside.mkdir()
        for pin in probe_dir.iterdir():  # bpffs renames pins, not directories
            pin.rename(aside / pin.name)
        probe_dir.rmdir()

    def _others(self) -> list[Path]:
        if not self._root.is_dir():
            return []
        return [d for d in self._root.iterdir() if d.is_dir() and d != self.dir]

    def _detach_others(self) -> None:
        for other in self._others():
            detach(other)

    def _take_over_retired(self) -> None:
        """Add the frozen totals of every retired probe to this probe's, at every start, so the
        exported totals go on across hand-overs and later restarts. A retired probe is removed
        once it holds no count (its cgroups forgotten)."""
        for other in self._others():
            kernel = None
            try:
                kernel = PinnedKernel(other, self._loader.shapes(), entries=False)
                kernel.open(names=("lost",))
                lost = kernel.read_lost()
                counts = kernel.read_counts() if kernel.aggregate else {}
                remote = kernel.read_remote()
            except (OSError, ProbeError, ValueError) as err:
                if kernel is not None:
                    kernel.close()
                unpin(other)
                log.warning(
                    "pinned probe %s unreadable, removed; its totals are lost: %s", other, err
                )
                continue
            self._inherited_lost.update(lost)
            if counts:
                self._inherited_counts.update(counts)
                self._inherited_remote.update(remote)
                self._retired.append(kernel)
                log.info("took over the totals of the retired probe %s (%s)", other, kernel.meta)
                continue
            kernel.close()
            unpin(other)

    def _reads(self) -> PinnedKernel | Loader:
        return self._active

    def poll(self, timeout_ms: int) -> None:
        self._active.poll(timeout_ms)

    def read_lost(self) -> dict[str, int]:
        lost = Counter(super().read_lost())
        lost.update(self._inherited_lost)
        return dict(lost)

    def read_counts(self) -> dict[Key, int]:
        counts = Counter(super().read_counts())
        counts.update(self._inherited_counts)
        return dict(counts)

    def read_remote(self) -> dict[Key, int]:
        remote = Counter(super().read_remote())
        remote.update(self._inherited_remote)
        return dict(remote)

    def forget_counts(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        super().forget_counts(keys)
        for kernel in self._retired:
            kernel.forget_counts(keys)
        for key in keys:
            self._inherited_counts.pop(key, None)
            self._inherited_remote.pop(key, None)

    def close(self) -> None:
        for kernel in self._retired:
            kernel.close()
        self._active.close()  # the pins keep the probe attached and its maps alive
