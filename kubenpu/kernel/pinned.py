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
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from kubenpu import __version__
from kubenpu.discovery import Device
from kubenpu.kernel import abi, bpfsys
from kubenpu.kernel.abi import GATE_HANDOVER, GATE_OPEN, LINK
from kubenpu.kernel.errors import ProbeError
from kubenpu.kernel.maps import MapReads, Maps, empty_devices
from kubenpu.kernel.records import Key

log = logging.getLogger(__name__)

_RETIRED = "-retired-"  # a set-aside directory's name: <identity>-retired-<ns> (bpffs forbids dots)
META = "meta"  # pinned last: its presence marks a complete pin directory
_META_SIZE = 1024
BIRTHS_LINK = f"{LINK}{abi.BIRTHS_TRACEPOINT}"


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


def _links(probe_dir: Path) -> list[Path]:
    return [p for p in probe_dir.iterdir() if p.name.startswith(LINK)]


def _detach(probe_dir: Path) -> None:
    """Unpin every link of a probe. Holding an fd of each while it is unpinned makes our close()
    the last reference, so the program is out of the kernel's trampoline once close returns (a
    link that another live process holds detaches when that process exits)."""
    for link in _links(probe_dir):
        try:
            fd = bpfsys.obj_get(link)
        except bpfsys.BpfError:
            fd = -1
        link.unlink()
        if fd >= 0:
            os.close(fd)


def _device_table(probe_dir: Path) -> dict[str, int] | None:
    """fds of a probe's device table (`minors`, where its layout has it, and `devices`), opened
    ahead of the hand-over window; None when it cannot be opened (then only its detach stops
    it)."""
    fds: dict[str, int] = {}
    try:
        for name in (abi.MINORS, abi.DEVICES):
            if name == abi.DEVICES or (probe_dir / name).exists():
                fds[name] = bpfsys.obj_get(probe_dir / name)
    except bpfsys.BpfError as err:
        log.warning("cannot open the device table of %s: %s", probe_dir, err)
        for fd in fds.values():
            os.close(fd)
        return None
    return fds


def on_bpffs(path: Path) -> bool:
    """Whether `path` (or, while it does not exist, its nearest parent) is on a bpffs."""
    while not path.exists():
        path = path.parent
    target = path.resolve().as_posix().rstrip("/") + "/"
    best, fstype = "", ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount, _, tail = line.partition(" - ")
        point = mount.split()[4].replace("\\040", " ").rstrip("/") + "/"
        if target.startswith(point) and len(point) >= len(best):
            best, fstype = point, tail.split()[0]
    return fstype == "bpf"


class PinnedKernel(MapReads):
    """A probe pinned in bpffs, used through bpf(2) and libbpf only (no BCC)."""

    def __init__(self, probe_dir: Path) -> None:
        self.dir = probe_dir
        self._fds: dict[str, int] = {}
        self._maps = Maps(self._fds)
        self.meta = _read_meta(probe_dir) if (probe_dir / META).exists() else {}
        self.aggregate = (probe_dir / abi.COUNTS).exists()  # what the program was built for
        self._ring: bpfsys.RingBuffer | None = None

    def complete(self) -> bool:
        """Pinned to the end (`meta`) and still attached (every link `meta` lists)."""
        links = self.meta.get("links", [])
        return bool(links) and all((self.dir / link).exists() for link in links)

    def open(self, names: Iterable[str] = abi.MAPS) -> None:
        """Open the pinned maps `names` (and `counts` in aggregate mode). Raises
        bpfsys.BpfError."""
        for name in (*names, *([abi.COUNTS] if self.aggregate else [])):
            self._fds[name] = bpfsys.obj_get(self.dir / name)

    def start(self, on_record: Callable[[bytes], None], devices: Iterable[Device]) -> str:
        attach = self.meta["attach"]  # KeyError: not a complete pin directory
        self.open()
        self._maps.fill(devices)  # what discovery found now (hot-plug, rebinding)
        self._ring = bpfsys.RingBuffer(self._fds[abi.EVENTS], on_record)
        return attach

    def set_gate(self, value: int) -> None:
        self._maps.set_gate(value)

    def poll(self, timeout_ms: int) -> None:
        self._ring.poll(timeout_ms)

    def close(self) -> None:
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def _read_meta(probe_dir: Path) -> dict:
    fd = bpfsys.obj_get(probe_dir / META)
    try:
        raw = bpfsys.lookup(fd, abi.U32.pack(0), _META_SIZE) or b""
    finally:
        os.close(fd)
    return json.loads(raw.rstrip(b"\0") or b"{}")


class Loader(Protocol):
    """What PinnedProbe needs of a loader, kernel.bcc.BccKernel or kernel.core.CoreKernel (tests
    use one made of plain maps)."""

    aggregate: bool
    hook: str
    loader: str
    gate_open: bool
    before_attach: Callable[[], None] | None

    def digest(self) -> str: ...

    def start(self, on_record: Callable[[bytes], None]) -> str: ...

    def objects(self) -> dict[str, int]: ...

    def poll(self, timeout_ms: int) -> None: ...

    def read_lost(self) -> dict[str, int]: ...

    def read_counts(self) -> dict[Key, int]: ...

    def forget_counts(self, keys: Iterable[Key]) -> None: ...

    def close(self) -> None: ...


def pin_objects(objects: dict[str, int], probe_dir: Path, meta: dict) -> bool:
    """Pin a loaded probe's objects in probe_dir, `meta` last (it marks the directory complete);
    False (logged, the directory removed) when that is not possible."""
    links = sorted(name for name in objects if name.startswith(LINK) and name != BIRTHS_LINK)
    if not links:
        log.warning("the kprobe attach cannot be pinned: counting stops with the agent")
        return False
    try:
        probe_dir.mkdir(parents=True, exist_ok=True)
        for name, fd in objects.items():
            bpfsys.obj_pin(fd, probe_dir / name)
        meta = dict(meta, links=sorted(n for n in objects if n.startswith(LINK)))
        raw = json.dumps(meta).encode().ljust(_META_SIZE, b"\0")
        fd = bpfsys.array_create("kubenpu_meta", raw[:_META_SIZE])
        try:
            bpfsys.obj_pin(fd, probe_dir / META)
        finally:
            os.close(fd)
    except (OSError, bpfsys.BpfError) as err:
        log.warning("cannot pin the probe in %s (it stops with the agent): %s", probe_dir, err)
        if probe_dir.exists():
            _unpin(probe_dir)
        return False
    log.info("pinned the probe in %s", probe_dir)
    return True


def _load_and_pin(loader: Loader, probe_dir: Path, meta: dict, reply, level: int) -> None:
    """The loader child: compile, load and attach with BCC, pin, report, exit. BCC and LLVM go
    with the child; the pins keep the probe attached."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        attach = loader.start(lambda _: None)
        pinned = pin_objects(loader.objects(), probe_dir, dict(meta, attach=attach))
        reply.send(("pinned" if pinned else "unpinned", attach))
    except ProbeError as err:
        reply.send(("error", str(err)))
    except Exception as err:  # one line for the operator, never a traceback
        reply.send(("error", f"the loader process failed: {err!r}"))


def load_in_child(loader: Loader, probe_dir: Path, meta: dict) -> bool:
    """Load and pin in a short-lived child process (spawned: a fresh interpreter that inherits
    no thread and no BCC). True once pinned; False when the child could not pin (a kprobe
    attach): then the caller loads in its own process. Raises ProbeError with the child's
    one-line error."""
    import multiprocessing  # a cold start only: an adopting restart never loads it

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    level = logging.getLogger().getEffectiveLevel()
    child = ctx.Process(
        target=_load_and_pin, args=(loader, probe_dir, meta, send, level), name="kubenpu-loader"
    )
    child.start()
    send.close()
    try:
        status, text = receive.recv()
    except EOFError:
        status, text = "error", "the loader process died before it reported"
    child.join()
    if status == "error":
        raise ProbeError(text)
    return status == "pinned"


Spawn = Callable[[Loader, Path, dict], bool]  # load_in_child


class PinnedProbe:
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
        self._loader.gate_open = not any(_links(other) for other in self._others())
        if self._spawn is not None and self._spawn(self._loader, self.dir, self.meta):
            attach = self._adopt(on_record, loaded=True)
            if attach is not None:
                return attach
            self._set_aside(self.dir)
        # In this process: CO-RE (libbpf only), or BCC without a child (then LLVM stays mapped).
        attach = self._loader.start(on_record)
        objects = self._loader.objects()
        pinned = pin_objects(objects, self.dir, dict(self.meta, attach=attach))
        self._hand_over(Maps(objects).set_gate)
        return f"{attach} (pinned in {self.dir})" if pinned else attach

    def _adopt(self, on_record: Callable[[bytes], None], loaded: bool = False) -> str | None:
        """The attach of this agent's own pinned probe, now in use; None if there is none."""
        if not (self.dir / META).exists():
            return None
        adopted = None
        try:
            adopted = PinnedKernel(self.dir)
            if not adopted.complete():
                adopted.close()
                return None  # detached or half pinned: not adoptable
            attach = adopted.start(on_record, self._devices)
            self._hand_over(adopted.set_gate)
        except (bpfsys.BpfError, KeyError, ValueError) as err:
            if adopted is not None:
                adopted.close()
            log.warning("pinned probe %s unusable, loading anew: %s", self.dir, err)
            return None
        self._active = adopted
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
        attached = [other for other in self._others() if _links(other)]
        tables = [t for t in map(_device_table, attached) if t is not None]
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
            _detach(other)

    def _set_aside(self, probe_dir: Path) -> None:
        """This agent's own directory, unusable (a crash while pinning): detach it and keep
        its totals under another name, as a retired probe."""
        _detach(probe_dir)
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
        for other in self._others():
            _detach(other)

    def _take_over_retired(self) -> None:
        """Add the frozen totals of every retired probe to this probe's, at every start, so the
        exported totals go on across hand-overs and later restarts. A retired probe is removed
        once it holds no count (its cgroups forgotten)."""
        for other in self._others():
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
