"""The kernel side pinned in bpffs, so it outlives the agent (docs/pinning.md).

`PinnedProbe` is the Kernel the agent uses when `probe.pin_dir` is set. At start it either
- adopts the probe pinned under ``pin_dir/<identity>/`` (same agent version, program digest,
  kernel release and mode): it opens the pinned maps with BPF_OBJ_GET, refreshes the device and
  ioctl tables from discovery and reads on; no BCC, no compile, no attach; or
- loads the program with BCC (`BccKernel`) and, once its maps are filled and before it attaches,
  retires every other pinned probe (unpins it, which detaches it, then reads its final totals,
  which the first reads add), attaches, and pins the new one.

A pin directory is complete once its `meta` map exists (it is pinned last); an incomplete one,
left by a crash while pinning, is removed at the next start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from kubenpu import __version__, bpfsys
from kubenpu.discovery import Device
from kubenpu.events import KERNEL_LOST, Key, dev_t
from kubenpu.probe import CountsReader, ProbeError, tables

log = logging.getLogger(__name__)

_RETIRED = "-retired-"  # a set-aside directory's name: <identity>-retired-<ns> (bpffs forbids dots)
META = "meta"  # pinned last: its presence marks a complete pin directory
_META_SIZE = 512


def uninstall(root: Path) -> int:
    """Remove every pinned probe under `root` (detaching it once no process holds it); returns
    how many there were."""
    if not root.is_dir():
        return 0
    probes = [d for d in root.iterdir() if d.is_dir()]
    for probe_dir in probes:
        _unpin(probe_dir)
    root.rmdir()
    return len(probes)


def _unpin(probe_dir: Path) -> None:
    # bpffs holds only pins: unlinking drops the references, rmdir the empty directory.
    shutil.rmtree(probe_dir)


class PinnedKernel:
    """A probe pinned in bpffs, used through bpf(2) and libbpf only (no BCC)."""

    def __init__(self, probe_dir: Path) -> None:
        self.dir = probe_dir
        self._fds: dict[str, int] = {}
        self.meta = _read_meta(probe_dir) if (probe_dir / META).exists() else {}
        self.aggregate = (probe_dir / "counts").exists()  # what the program was built for
        self._ring: bpfsys.RingBuffer | None = None
        self._reader: CountsReader | None = None
        self._ncpus = bpfsys.possible_cpus()

    def open(self, names: Iterable[str] = ("devices", "ioctls", "lost", "events")) -> None:
        """Open the pinned maps `names` (and `counts` in aggregate mode). Raises
        bpfsys.BpfError."""
        for name in (*names, *(["counts"] if self.aggregate else [])):
            self._fds[name] = bpfsys.obj_get(self.dir / name)

    def start(self, on_record: Callable[[bytes], None], devices: Iterable[Device]) -> str:
        attach = self.meta["attach"]  # KeyError: not a complete pin directory
        self.open()
        self.refresh(devices)
        self._ring = bpfsys.RingBuffer(self._fds["events"], on_record)
        return attach

    def refresh(self, devices: Iterable[Device]) -> None:
        """Make the device and ioctl tables what discovery found now (hot-plug, rebinding)."""
        by_node, ioctls = tables(devices)
        _sync(self._fds["devices"], 4, {struct.pack("=I", k): v for k, v in by_node.items()})
        _sync(self._fds["ioctls"], 8, {struct.pack("=II", *k): v for k, v in ioctls.items()})

    def poll(self, timeout_ms: int) -> None:
        self._ring.poll(timeout_ms)

    def read_lost(self) -> dict[str, int]:
        found = {}
        for i, name in enumerate(KERNEL_LOST):
            raw = bpfsys.lookup(self._fds["lost"], struct.pack("=I", i), 8 * self._ncpus)
            found[name] = sum(struct.unpack(f"={self._ncpus}Q", raw)) if raw else 0
        return found

    def read_counts(self) -> dict[Key, int]:
        if self._reader is None:
            self._reader = CountsReader(self._fds["counts"])
        return self._reader.read()

    def forget_counts(self, keys: Iterable[Key]) -> None:
        for key in keys:
            packed = struct.pack("=QII", key.cgroup_id, dev_t(key.major, key.minor), key.kind)
            bpfsys.delete(self._fds["counts"], packed)

    def close(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _sync(fd: int, key_size: int, wanted: dict[bytes, int]) -> None:
    for key in bpfsys.keys(fd, key_size):
        if key not in wanted:
            bpfsys.delete(fd, key)
    for key, value in wanted.items():
        bpfsys.update(fd, key, struct.pack("=I", value))


def _read_meta(probe_dir: Path) -> dict:
    fd = bpfsys.obj_get(probe_dir / META)
    try:
        raw = bpfsys.lookup(fd, struct.pack("=I", 0), _META_SIZE) or b""
    finally:
        os.close(fd)
    return json.loads(raw.rstrip(b"\0") or b"{}")


class Loader(Protocol):
    """What PinnedProbe needs of probe.BccKernel (tests use one made of plain maps)."""

    aggregate: bool
    before_attach: Callable[[], None] | None

    def digest(self) -> str: ...

    def start(self, on_record: Callable[[bytes], None]) -> str: ...

    def objects(self) -> dict[str, int]: ...

    def poll(self, timeout_ms: int) -> None: ...

    def read_lost(self) -> dict[str, int]: ...

    def read_counts(self) -> dict[Key, int]: ...

    def forget_counts(self, keys: Iterable[Key]) -> None: ...

    def close(self) -> None: ...


class PinnedProbe:
    """The agent's Kernel with `probe.pin_dir` set: adopts a matching pinned probe, or loads
    one with BCC, hands over from any other pinned one, and pins it."""

    def __init__(self, root: Path, loader: Loader, devices: Iterable[Device]) -> None:
        self._root = root
        self._devices = list(devices)
        self._loader = loader
        self.aggregate = loader.aggregate
        loader.before_attach = self._detach_others
        mode = "aggregate" if loader.aggregate else "events"
        self.meta = {
            "version": __version__,
            "program": self._loader.digest(),
            "kernel": os.uname().release,
            "mode": mode,
        }
        # The directory's name is the identity: an agent finds its own probe by name.
        ident = hashlib.sha256(json.dumps(self.meta, sort_keys=True).encode()).hexdigest()
        self.dir = root / ident[:16]
        self._active: PinnedKernel | Loader = self._loader
        self._inherited_counts: Counter[Key] = Counter()
        self._inherited_lost: Counter[str] = Counter()
        self._retired: list[PinnedKernel] = []  # kept open: their keys are forgotten too

    def start(self, on_record: Callable[[bytes], None]) -> str:
        if not self.aggregate:
            # Events mode (per-call records, --trace) keeps its counts in the process, so there
            # is nothing worth pinning. It still detaches pinned probes, so that one program
            # counts, and leaves their totals pinned for the next aggregate-mode agent.
            return self._loader.start(on_record)  # calls _detach_others before attaching
        attach = self._adopt(on_record)
        if attach is None:
            if self.dir.exists():
                self._set_aside(self.dir)
            attach = self._loader.start(on_record)  # calls _detach_others before attaching
            self._pin(attach)
        self._take_over_retired()
        return attach

    def _adopt(self, on_record: Callable[[bytes], None]) -> str | None:
        """The attach of this agent's own pinned probe, now in use; None if there is none."""
        if not (self.dir / "link").exists():
            return None  # none, or detached: then not adoptable
        adopted = None
        try:
            adopted = PinnedKernel(self.dir)
            attach = adopted.start(on_record, self._devices)
        except (bpfsys.BpfError, KeyError, ValueError) as err:
            if adopted is not None:
                adopted.close()
            log.warning("pinned probe %s unusable, loading anew: %s", self.dir, err)
            return None
        self._active = adopted
        log.info("adopted the pinned probe %s (no compile, no attach)", self.dir)
        log.warning(  # births need BCC's compile, which adoption avoids (docs/pinning.md)
            "cgroup births unavailable with an adopted probe: "
            "short-lived containers may lose their pod"
        )
        return f"{attach} (adopted from {self.dir})"

    def _set_aside(self, probe_dir: Path) -> None:
        """This agent's own directory, unusable (a crash while pinning): detach it and keep
        its totals under another name, as a retired probe."""
        (probe_dir / "link").unlink(missing_ok=True)
        aside = probe_dir.with_name(f"{probe_dir.name}{_RETIRED}{time.time_ns()}")
        aside.mkdir()
        for pin in probe_dir.iterdir():  # bpffs renames pins, not directories
            pin.rename(aside / pin.name)
        probe_dir.rmdir()

    def _others(self) -> list[Path]:
        if not self._root.is_dir():
            return []
        return [d for d in self._root.iterdir() if d.is_dir() and d != self.dir]

    def _detach_others(self) -> None:
        """Hand-over, right before the new program attaches: unpin every other probe's link,
        which detaches it (no process holds it once its agent is gone). Their maps stay
        pinned: they hold the final totals, which _take_over_retired adds to this probe's."""
        for other in self._others():
            (other / "link").unlink(missing_ok=True)

    def _take_over_retired(self) -> None:
        """Add the frozen totals of every retired probe to this probe's, at every start, so the
        exported totals go on across hand-overs and later restarts. A retired probe is removed
        once it holds no count (its cgroups forgotten)."""
        for other in self._others():
            if (other / "link").exists():  # still attached: a crash mid-hand-over, or 2 agents
                log.warning("detaching the pinned probe %s: this agent's probe counts", other)
                (other / "link").unlink()
            kernel = None
            try:
                kernel = PinnedKernel(other)
                kernel.open(names=("lost",))
                lost = kernel.read_lost()
                counts = kernel.read_counts() if kernel.aggregate else {}
            except (OSError, ProbeError, ValueError) as err:
                if kernel is not None:
                    kernel.close()
                _unpin(other)
                log.warning(
                    "pinned probe %s unreadable, removed; its totals are lost: %s", other, err
                )
                continue
            self._inherited_lost.update(lost)
            if counts:
                self._inherited_counts.update(counts)
                self._retired.append(kernel)
                log.info("took over the totals of the retired probe %s (%s)", other, kernel.meta)
                continue
            kernel.close()
            _unpin(other)

    def _pin(self, attach: str) -> None:
        objects = self._loader.objects()
        if "link" not in objects:
            log.warning("the kprobe attach cannot be pinned: counting stops with the agent")
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for name, fd in objects.items():
                bpfsys.obj_pin(fd, self.dir / name)
            self._pin_meta(dict(self.meta, attach=attach))
        except (OSError, bpfsys.BpfError) as err:
            log.warning("cannot pin the probe in %s (it stops with the agent): %s", self.dir, err)
            if self.dir.exists():
                _unpin(self.dir)
            return
        log.info("pinned the probe in %s", self.dir)

    def _pin_meta(self, meta: dict) -> None:
        raw = json.dumps(meta).encode().ljust(_META_SIZE, b"\0")
        fd = bpfsys.array_create("kubenpu_meta", raw[:_META_SIZE])
        try:
            bpfsys.obj_pin(fd, self.dir / META)
        finally:
            os.close(fd)

    def poll(self, timeout_ms: int) -> None:
        self._active.poll(timeout_ms)

    def read_lost(self) -> dict[str, int]:
        lost = Counter(self._active.read_lost())
        lost.update(self._inherited_lost)
        return dict(lost)

    def read_counts(self) -> dict[Key, int]:
        counts = Counter(self._active.read_counts())
        counts.update(self._inherited_counts)
        return dict(counts)

    def forget_counts(self, keys: Iterable[Key]) -> None:
        keys = list(keys)
        self._active.forget_counts(keys)
        for kernel in self._retired:
            kernel.forget_counts(keys)
        for key in keys:
            self._inherited_counts.pop(key, None)

    def close(self) -> None:
        for kernel in self._retired:
            kernel.close()
        self._active.close()  # the pins keep the probe attached and its maps alive
