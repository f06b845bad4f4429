"""The pin directory's format (docs/pinning.md): one directory per probe under `probe.pin_dir`,
named by its identity, holding its maps, its links (link-<function>) and `meta`, pinned last, so
that its presence marks a complete directory. Pinning, reading and removing one; PinnedKernel, a
pinned probe used through bpf(2) alone.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from kubenpu.discovery import Device
from kubenpu.kernel import abi, bpfsys
from kubenpu.kernel.abi import LINK
from kubenpu.kernel.base import MapKernel
from kubenpu.kernel.maps import Maps

log = logging.getLogger(__name__)

RETIRED = "-retired-"  # a set-aside directory's name: <identity>-retired-<ns> (bpffs forbids dots)
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
        unpin(probe_dir)
    root.rmdir()
    return len(probes)


def unpin(probe_dir: Path) -> None:
    # bpffs holds only pins: unlinking drops the references, rmdir the empty directory.
    shutil.rmtree(probe_dir)


def links(probe_dir: Path) -> list[Path]:
    return [p for p in probe_dir.iterdir() if p.name.startswith(LINK)]


def detach(probe_dir: Path) -> None:
    """Unpin every link of a probe. Holding an fd of each while it is unpinned makes our close()
    the last reference, so the program is out of the kernel's trampoline once close returns (a
    link that another live process holds detaches when that process exits)."""
    for link in links(probe_dir):
        try:
            fd = bpfsys.obj_get(link)
        except bpfsys.BpfError:
            fd = -1
        link.unlink()
        if fd >= 0:
            os.close(fd)


def device_table(probe_dir: Path) -> dict[str, int] | None:
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


class Incompatible(ValueError):
    """A pinned map whose type, key size, value size or entries are not the program's."""


class PinnedKernel(MapKernel):
    """A probe pinned in bpffs, used through bpf(2) and libbpf only (no BCC). Each map it opens
    is checked against `shapes` first (Tetragon's model): all four fields for an adoption, only
    the layout (type, key and value size) with `entries=False`, to read a retired probe's
    totals, whose sizes may be another version's."""

    def __init__(
        self,
        probe_dir: Path,
        shapes: Mapping[str, abi.MapShape] | None = None,
        entries: bool = True,
    ) -> None:
        self.dir = probe_dir
        self._shapes = shapes or {}
        self._entries = entries
        self._fds: dict[str, int] = {}
        self._maps = Maps(self._fds)
        self.meta = _read_meta(probe_dir) if (probe_dir / META).exists() else {}
        self.aggregate = (probe_dir / abi.COUNTS).exists()  # what the program was built for

    def complete(self) -> bool:
        """Pinned to the end (`meta`) and still attached (every link `meta` lists)."""
        links = self.meta.get("links", [])
        return bool(links) and all((self.dir / link).exists() for link in links)

    def open(self, names: Iterable[str] = abi.MAPS) -> None:
        """Open the pinned maps `names` (and `counts` in aggregate mode). Raises
        bpfsys.BpfError, or Incompatible before any map is written."""
        timed = [n for n in abi.DURATION_MAPS if (self.dir / n).exists()]
        for name in (*names, *([abi.COUNTS] if self.aggregate else []), *timed):
            self._fds[name] = bpfsys.obj_get(self.dir / name)
            if name in self._shapes:
                self._check(name, bpfsys.map_shape(self._fds[name]), self._shapes[name])

    def _check(self, name: str, found: abi.MapShape, want: abi.MapShape) -> None:
        if (found if self._entries else found[:3]) != (want if self._entries else want[:3]):
            raise Incompatible(f"the pinned map {name} is {found}, the program's {want}")

    def start(self, on_record: Callable[[bytes], None], devices: Iterable[Device]) -> str:
        attach = self.meta["attach"]  # KeyError: not a complete pin directory
        self.open()
        self._maps.fill(devices)  # what discovery found now (hot-plug, rebinding)
        self._open_ring(on_record)
        return attach

    def set_gate(self, value: int) -> None:
        self._maps.set_gate(value)

    def close(self) -> None:
        self._close_ring()
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
            unpin(probe_dir)
        return False
    log.info("pinned the probe in %s", probe_dir)
    return True
