"""DRM fdinfo: device time and memory per DRM client, read from /proc/PID/fdinfo/FD.

The kernel's Documentation/gpu/drm-usage-stats.rst defines the text a DRM driver prints there:
``drm-driver``, ``drm-pdev`` and ``drm-client-id`` name the client; ``drm-engine-<e>`` (ns),
``drm-engine-capacity-<e>``, ``drm-cycles-<e>``, ``drm-total-cycles-<e>`` and ``drm-maxfreq-<e>``
describe engines; ``drm-{total,shared,resident,active,purgeable}-<region>`` describe memory, and
the deprecated ``drm-memory-<region>`` means resident. Other keys (``amd-*``, ``drm-curfreq-*``,
the VFS's ``pos:``/``flags:``) are not part of the spec and are ignored.

One client is one open DRM file (one ``struct drm_file``). dup(), fork() and SCM_RIGHTS share it
between fds and processes, so clients are keyed by (device, drm-client-id) and counted once, with
every pid that holds them.

Cost: only fds whose link target is a DRM or accel node have their fdinfo read; every other fd
costs one readlink. ``scan(pids)`` reads just the given processes, ``scan()`` all of /proc.

Nothing here raises on what it reads: a process or fd that goes away, fdinfo the reader may not
read, a line that breaks the spec, a client on a device discovery does not know, each is skipped
and counted by reason in ``Scan.skipped``.
"""

from __future__ import annotations

import os
import re
import stat
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from kubenpu.descriptors import exhausted
from kubenpu.discovery import Device
from kubenpu.files import read_regular
from kubenpu.metrics.catalogue import Skip
from kubenpu.text import ascii_digits

# Node directories (discovery's drm_devnode/accel_devnode names), as fd links spell them.
_NODE_DIRS = ("/dev/dri/", "/dev/accel/")
_DELETED = " (deleted)"  # what d_path appends to an unlinked file's path

_K = TypeVar("_K")


# Value units per key kind; "" is a bare number. The spec fixes each kind's unit set.
_TIME = {"": 1, "ns": 1}
_COUNT = {"": 1}
_FREQ = {"": 1, "Hz": 1, "KHz": 1_000, "kHz": 1_000, "MHz": 1_000_000}
_SIZE = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

# drm-<prefix><name> -> (table, field, units). Longest prefixes first: "drm-total-cycles-rcs" is
# an engine key, not memory region "cycles-rcs", and "drm-engine-capacity-vcs" is no engine
# named "capacity-vcs".
_ENGINES = "engines"
_MEMORY = "memory"
_KEYS: tuple[tuple[str, str, str, dict[str, int]], ...] = (
    ("drm-engine-capacity-", _ENGINES, "capacity", _COUNT),
    ("drm-total-cycles-", _ENGINES, "total_cycles", _COUNT),
    ("drm-engine-", _ENGINES, "busy_ns", _TIME),
    ("drm-cycles-", _ENGINES, "cycles", _COUNT),
    ("drm-maxfreq-", _ENGINES, "maxfreq_hz", _FREQ),
    ("drm-total-", _MEMORY, "total", _SIZE),
    ("drm-shared-", _MEMORY, "shared", _SIZE),
    ("drm-resident-", _MEMORY, "resident", _SIZE),
    ("drm-active-", _MEMORY, "active", _SIZE),
    ("drm-purgeable-", _MEMORY, "purgeable", _SIZE),
)
_LEGACY_MEMORY = "drm-memory-"  # deprecated alias of drm-resident-
# A u64 has 20 digits; a longer number is malformed (and int() raises past 4,300 digits).
_VALUE = re.compile(r"(-?\d{1,20})\s*([A-Za-z]*)", re.ASCII)
MAX_VALUE = 2**63 - 1  # OTLP's int64 data points; a Prometheus float holds it too
# A DRM fdinfo file is a few hundred bytes; what is past this is cut at a line and counted.
_MAX_FDINFO = 64 * 1024
# /proc/PID/cgroup: one line per hierarchy, each path at most PATH_MAX.
_MAX_CGROUP = 64 * 1024
_PDEV = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
# Engine and region names become labels, the driver's name a column: the kernel's are a few
# characters ("render", "vram0"); a longer one is malformed, not a label of any length.
_MAX_NAME = 64

# {name: {field: value}}: only the fields the driver printed.
Stats = dict[str, dict[str, int]]


@dataclass
class Fdinfo:
    """What one fdinfo file says under the spec."""

    driver: str | None = None
    pdev: str | None = None
    client_id: int | None = None
    engines: Stats = field(default_factory=dict)
    memory: Stats = field(default_factory=dict)
    skipped: Counter[Skip] = field(default_factory=Counter)  # drm- lines dropped, by reason


@dataclass
class Client:
    """One DRM client: an open DRM file, however many fds and processes share it."""

    device: str  # the id `kubenpuctl devices` prints: PCI address or platform:<name>
    driver: str  # drm-driver, e.g. i915 (the DRM driver's name, not always sysfs's)
    client_id: int
    pids: list[int]  # sorted
    cgroup: str | None  # cgroup v2 path of the lowest pid, as /proc/PID/cgroup writes it
    engines: Stats  # {engine: {busy_ns, capacity, cycles, total_cycles, maxfreq_hz}}
    memory: Stats  # {region: {total, shared, resident, active, purgeable}} in bytes


@dataclass
class Scan:
    clients: list[Client]  # ordered by (device, client_id)
    skipped: Counter[Skip]
    drm_fds: int  # fds whose fdinfo was read
    unreadable: set[int] = field(default_factory=set)  # pids whose fds could not all be read


def parse(text: str) -> Fdinfo:
    """The spec's keys from one fdinfo file's text."""
    info = Fdinfo()
    legacy: Stats = {}  # drm-memory-<region>: {resident}
    for line in text.splitlines():
        key, colon, raw = line.partition(":")
        key, value = key.strip(), raw.strip()
        if not key.startswith("drm-"):
            continue  # VFS lines (pos, flags, mnt_id, ino) and driver-specific keys
        if not colon:
            info.skipped[Skip.MALFORMED] += 1
        elif reason := _parse_line(info, legacy, key, value):
            info.skipped[reason] += 1
    for region, fields in legacy.items():
        # drm-resident-X wins when a driver prints both (amdgpu does, in KiB for the alias).
        info.memory.setdefault(region, {}).setdefault("resident", fields["resident"])
    return info


def _parse_line(info: Fdinfo, legacy: Stats, key: str, value: str) -> Skip | None:
    """Store one drm- key; why not when its value is not used."""
    # A skipped value never overwrites a good one printed earlier.
    if key == "drm-driver":
        valid = 0 < len(value) <= _MAX_NAME
        info.driver = value if valid else info.driver
        return None if valid else Skip.MALFORMED
    if key == "drm-pdev":
        valid = _PDEV.fullmatch(value.lower()) is not None
        info.pdev = value.lower() if valid else info.pdev
        return None if valid else Skip.MALFORMED
    if key == "drm-client-id":
        number = parse_number(value, _COUNT)
        if isinstance(number, Skip):
            return number
        info.client_id = number
        return None
    if key.startswith(_LEGACY_MEMORY):
        return _store(
            legacy, key.removeprefix(_LEGACY_MEMORY), "resident", parse_number(value, _SIZE)
        )
    for prefix, table, name, units in _KEYS:
        if key.startswith(prefix):
            number = parse_number(value, units)
            if name == "capacity" and number == 0:
                number = Skip.MALFORMED  # "Zero capacity is not allowed"
            stats = info.engines if table == _ENGINES else info.memory
            return _store(stats, key.removeprefix(prefix), name, number)
    return None  # a drm- key the spec does not define (drm-client-name, drm-curfreq-...)


def _store(stats: Stats, name: str, what: str, number: int | Skip) -> Skip | None:
    if not name or len(name) > _MAX_NAME:
        return Skip.MALFORMED
    if isinstance(number, Skip):
        return number
    stats.setdefault(name, {})[what] = number
    return None


def parse_number(value: str, units: dict[str, int], signed: bool = False) -> int | Skip:
    """<uint> (an <int> when signed) with an optional unit from units, in the base unit; else
    why it is skipped. The one bounded parser of kernel numbers: sysfs telemetry uses it too."""
    match = _VALUE.fullmatch(value)
    if match is None or match[2] not in units or (match[1][0] == "-" and not signed):
        return Skip.MALFORMED
    number = int(match[1]) * units[match[2]]
    return number if abs(number) <= MAX_VALUE else Skip.OUT_OF_RANGE


class FdinfoReader:
    """Reads DRM clients from root/proc, naming devices as discovery does.

    root is "/" on a node, or a copy of a machine (proc/ and sys/) for kubenpuctl and tests. On
    the live /proc an fd's device comes from stat() of its magic link (its real dev_t); in a copy
    the links are plain symlinks, so the node path names it.
    """

    def __init__(self, devices: Iterable[Device], root: str | Path = "/") -> None:
        self._root = Path(root)
        self._proc = self._root / "proc"
        self._live = self._root.resolve() == Path("/")
        devices = list(devices)
        self._by_rdev = {(n.major, n.minor): d.id for d in devices for n in d.nodes}
        self._by_path = {n.path: d.id for d in devices for n in d.nodes}

    def scan(self, pids: Iterable[int] | None = None) -> Scan:
        """The clients held by pids (every process when None)."""
        scan = _Builder()
        for pid in self._all_pids() if pids is None else pids:
            self._scan_pid(pid, scan)
        return scan.result(self.cgroup)

    def _all_pids(self) -> list[int]:
        try:
            pids = sorted(int(name) for name in os.listdir(self._proc) if ascii_digits(name))
        except OSError:
            return []  # no proc: nothing to read (kubenpuctl checks the directory first)
        # Not the reader itself: the fd of its own fd/ listing would vanish under it every time.
        return [p for p in pids if not (self._live and p == os.getpid())]

    def _scan_pid(self, pid: int, scan: _Builder) -> None:
        fd_dir = self._proc / str(pid) / "fd"
        try:
            entries = list(os.scandir(fd_dir))
        except OSError as e:
            scan.skip(_reason(e), pid=pid)
            return
        for entry in entries:
            try:
                target = os.readlink(entry.path)
            except OSError as e:
                scan.skip(reason := _reason(e), pid=pid)
                if reason is Skip.UNREADABLE:
                    return  # the ptrace check is per process: every other fd fails alike
                continue
            if target.startswith(_NODE_DIRS):
                self._read_fd(pid, entry.name, target, scan)

    def _read_fd(self, pid: int, fd: str, target: str, scan: _Builder) -> None:
        try:
            data = read_regular(self._proc / str(pid) / "fdinfo" / fd, _MAX_FDINFO + 1)
        except OSError as e:
            scan.skip(_reason(e), pid=pid)
            return
        scan.drm_fds += 1
        if len(data) > _MAX_FDINFO:  # the last line may be cut: keep whole lines only
            data = data[: data.rfind(b"\n", 0, _MAX_FDINFO) + 1]
            scan.skip(Skip.MALFORMED)
        info = parse(data.decode("utf-8", "replace"))
        for reason, n in info.skipped.items():
            scan.skip(reason, n)
        if info.client_id is None or info.driver is None:
            scan.skip(Skip.NO_CLIENT_ID)
            return
        device = info.pdev or self._node_device(pid, fd, target)
        if device is None:
            scan.skip(Skip.UNKNOWN_DEVICE)
            return
        scan.add(device, pid, info)

    def _node_device(self, pid: int, fd: str, target: str) -> str | None:
        """The device of the node an fd has open, by dev_t where the tree has one."""
        target = target.removesuffix(_DELETED)  # the node was unlinked since the open
        node = self._proc / str(pid) / "fd" / fd if self._live else self._root / target[1:]
        try:
            st = os.stat(node)
        except OSError:
            st = None
        if st is not None and stat.S_ISCHR(st.st_mode):
            return self._by_rdev.get((os.major(st.st_rdev), os.minor(st.st_rdev)))
        return self._by_path.get(target)

    def cgroup(self, pid: int) -> str | None:
        """The cgroup v2 path ("0::" line) of pid; None when gone or v1-only. Raises OSError
        when no descriptor is left (the pid's cgroup is unknown, not none)."""
        try:
            text = read_regular(self._proc / str(pid) / "cgroup", _MAX_CGROUP).decode()
        except OSError as e:
            if exhausted(e):
                raise
            return None
        except UnicodeDecodeError:
            return None
        return next((line[3:] for line in text.splitlines() if line.startswith("0::")), None)


def _reason(error: OSError) -> Skip:
    # ENOENT: the fd was closed; ESRCH: the process exited while we read its directory.
    if isinstance(error, FileNotFoundError | ProcessLookupError):
        return Skip.VANISHED
    return Skip.NO_DESCRIPTORS if exhausted(error) else Skip.UNREADABLE


# Skips after which what a pid holds is unknown: its clients are not taken as closed.
_UNKNOWN = (Skip.UNREADABLE, Skip.NO_DESCRIPTORS)


class _Builder:
    """Merges fds into clients: the first fd read gives a client's numbers, later ones its pids."""

    def __init__(self) -> None:
        self.skipped: Counter[Skip] = Counter()
        self.drm_fds = 0
        self.unreadable: set[int] = set()
        self._clients: dict[tuple[str, int], tuple[Fdinfo, set[int]]] = {}

    def skip(self, reason: Skip, count: int = 1, pid: int | None = None) -> None:
        if count:
            self.skipped[reason] += count
        if reason in _UNKNOWN and pid is not None:
            self.unreadable.add(pid)  # what it holds is unknown, not closed

    def add(self, device: str, pid: int, info: Fdinfo) -> None:
        assert info.client_id is not None
        self._clients.setdefault((device, info.client_id), (info, set()))[1].add(pid)

    def result(self, cgroup_of: Callable[[int], str | None]) -> Scan:
        clients = []
        for (device, client_id), (info, pids) in sorted(self._clients.items()):
            try:
                cgroup = cgroup_of(min(pids))
            except OSError:  # out of descriptors: left for the next read, not taken as closed
                self.skip(Skip.NO_DESCRIPTORS)
                self.unreadable.update(pids)
                continue
            clients.append(
                Client(
                    device=device,
                    driver=info.driver or "",
                    client_id=client_id,
                    pids=sorted(pids),
                    cgroup=cgroup,
                    engines=info.engines,
                    memory=info.memory,
                )
            )
        return Scan(clients, self.skipped, self.drm_fds, self.unreadable)


class HighWater(Generic[_K]):
    """Per key, the largest value seen so far.

    The spec lets drm-engine-* and drm-cycles-* go backwards for a while and asks readers to stay
    at the larger earlier value until a new one overtakes it; feed every reading through here.
    """

    def __init__(self) -> None:
        self._max: dict[_K, int] = {}

    def update(self, key: _K, value: int) -> int:
        best = max(value, self._max.get(key, value))
        self._max[key] = best
        return best

    def get(self, key: _K) -> int:
        """The largest value seen for key; 0 before any."""
        return self._max.get(key, 0)
