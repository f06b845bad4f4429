"""cgroup id -> cgroup v2 path.

bpf_get_current_cgroup_id() is the inode number of the process's cgroup v2 directory, so one walk
of the hierarchy maps every id to its path. The walk is redone only when an unknown id shows up.
A cgroup the kernel reports as new is indexed from its parent's directory alone (cgroups_born), so
a short-lived container stays known after its directory is removed.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable

from kubenpu.descriptors import CGROUP_WALK, Exhaustion, exhausted

log = logging.getLogger(__name__)

# Cgroups indexed at birth that nobody asked about are dropped once gone for this long (most new
# cgroups on a node never call a GPU driver), checked when their number doubles.
_UNCLAIMED_GRACE_SECONDS = 300.0
_PRUNE_MIN = 1024
# The cgroup_mkdir tracepoint fires just before kernfs makes the directory visible
# (kernfs_activate), so a birth read at once may not find it yet: look again after this pause,
# then once more at the next birth.
_NOT_VISIBLE_YET_SECONDS = 0.001
_UNBORN_MAX = 4096
# The tree's counters in the root's cgroup.stat: a removal moves nr_descendants at once and
# nr_dying_descendants until the kernel frees the cgroup (kernel/cgroup/cgroup.c).
_TREE_COUNTERS = ("nr_descendants", "nr_dying_descendants")
# Every known cgroup is checked this often all the same: a birth, a removal and its free can
# cancel out in the counters between two checks when no births come (no births program).
_SWEEP_SECONDS = 60.0


class CgroupIndex:
    """Thread-safe: cgroups_born() runs on the probe's thread, the rest on the attribution
    thread."""

    def __init__(
        self,
        root: str = "/sys/fs/cgroup",
        on_rebuild: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_exhausted: Callable[[str, int], None] | None = None,
    ) -> None:
        self._root = root
        self._exhaustion = Exhaustion(CGROUP_WALK, on_exhausted)
        # The last walk ran out of descriptors: the ids it missed may exist, so they are
        # looked for again (once per index() batch), not taken as gone.
        self._partial = False
        self._on_rebuild = on_rebuild
        self._clock = clock
        self._lock = threading.Lock()  # guards the fields below; never held during a walk
        self._walking = threading.Lock()  # one walk at a time
        self._paths: dict[int, str] = {}
        # Ids that were missing after the last walk: asking again must not walk again, or a
        # stream of events from one vanished cgroup would walk the tree once per event.
        self._missing: set[int] = set()
        # Ids indexed at birth and not asked about yet -> birth time: a walk keeps them even
        # when their directory is gone; _prune() drops the old gone ones.
        self._unclaimed: dict[int, float] = {}
        # Births whose directory was not visible yet -> the parent's path; looked at once more.
        self._unborn: dict[int, str] = {}
        self._prune_at = _PRUNE_MIN
        self._dev: int | None = None  # the root's file system, from the last walk
        self._root_error: str | None = None
        self.rebuilds = 0
        self._tree: tuple[int, ...] | None = None  # _TREE_COUNTERS at the last removed() check
        self._born = False  # births since that check
        self._swept = -float("inf")

    def path(self, cgroup_id: int) -> str | None:
        """Path relative to the root ("" for the root itself); None if no such cgroup exists."""
        with self._lock:
            self._unclaimed.pop(cgroup_id, None)
        return self._find(cgroup_id)

    def cgroups_born(self, births: Iterable[tuple[int, int]]) -> None:
        """Index new cgroups, (id, parent id) each, from one scan of each parent's directory
        for all of them (one walk at most for the parents not known, e.g. before the first
        walk). 5,000 births of cgroups already gone scanned their parent 10,000 times, one
        birth at a time, and held up the poll thread for 20 s."""
        with self._lock:
            self._born = True
        self._look_again()
        # Known already (a walk found it): kept through the next walks all the same.
        todo = [(c, p) for c, p in births if not self._claim_born(c)]
        if not todo:
            return
        self.index(p for _, p in todo)
        with self._lock:
            dev = self._dev
            parents = {c: self._paths.get(p) for c, p in todo}
        if dev is None:
            return  # the root is unreadable
        wanted: dict[str, set[int]] = {}
        for cgroup_id, parent in parents.items():
            if parent is not None and not self._claim_born(cgroup_id):  # else outside the root
                wanted.setdefault(parent, set()).add(cgroup_id)
        if wanted and (wanted := self._index_children(wanted, dev)):
            time.sleep(_NOT_VISIBLE_YET_SECONDS)
            wanted = self._index_children(wanted, dev)
        with self._lock:
            for parent, ids in wanted.items():
                self._unborn.update(dict.fromkeys(ids, parent))
            while len(self._unborn) > _UNBORN_MAX:
                del self._unborn[next(iter(self._unborn))]

    def _index_children(self, wanted: dict[str, set[int]], dev: int) -> dict[str, set[int]]:
        """Index the wanted children of each parent, one scan per parent; those not found (not
        visible yet, or already gone: nothing left to name them by)."""
        left: dict[str, set[int]] = {}
        for parent, ids in wanted.items():
            found = _subdirs(self._root, parent, dev, self._exhaustion, inodes=ids)
            for cgroup_id, path in found:
                self._claim_born(cgroup_id, path)
            if rest := ids - {cgroup_id for cgroup_id, _ in found}:
                left[parent] = rest
        return left

    def _look_again(self) -> None:
        """One more look for births that were not visible yet; then they are given up."""
        with self._lock:
            unborn, self._unborn = self._unborn, {}
            dev = self._dev
        wanted: dict[str, set[int]] = {}
        for cgroup_id, parent in unborn.items():
            wanted.setdefault(parent, set()).add(cgroup_id)
        if dev is not None and wanted:
            self._index_children(wanted, dev)

    def _claim_born(self, cgroup_id: int, path: str | None = None) -> bool:
        """Marks a known cgroup (or a new one at `path`) as born; False if unknown."""
        with self._lock:
            if path is not None:
                self._paths[cgroup_id] = path
                self._missing.discard(cgroup_id)
            elif cgroup_id not in self._paths:
                return False
            self._unclaimed.setdefault(cgroup_id, self._clock())
            prune = len(self._unclaimed) >= self._prune_at
        if prune:
            self._prune()
        return True

    def alive(self, cgroup_id: int) -> bool:
        """Whether a known cgroup still exists (one stat; never walks)."""
        with self._lock:
            path = self._paths.get(cgroup_id)
        return path is not None and _exists(self._root, path, cgroup_id)

    def removed(self) -> bool:
        """Whether a cgroup may have been removed since the last True: the root's cgroup.stat
        counters moved, a birth came, or _SWEEP_SECONDS passed; True where cgroup.stat does not
        read (not a cgroup v2 root). The reap checks each known cgroup only then: 1,000 pods'
        stats every 5 s were half of an idle agent's CPU."""
        tree, now = _tree_counters(self._root), self._clock()
        with self._lock:
            removed = (
                tree is None
                or tree != self._tree
                or self._born
                or now - self._swept >= _SWEEP_SECONDS
            )
            self._tree, self._born = tree, False
            if removed:
                self._swept = now
        return removed

    def forget(self, cgroup_id: int) -> None:
        with self._lock:
            self._paths.pop(cgroup_id, None)
            self._missing.discard(cgroup_id)
            self._unclaimed.pop(cgroup_id, None)

    def index(self, cgroup_ids: Iterable[int]) -> None:
        """Walk once for all the ids not known yet, found or missing: 200 first sightings from
        cgroups already removed walked a tree of 10,000 directories 200 times."""
        with self._lock:
            if self._partial:
                self._missing.clear()
            unknown = {c for c in cgroup_ids if c not in self._paths and c not in self._missing}
        if not unknown:
            return
        with self._walking:
            self._rebuild()
        with self._lock:
            self._missing.update(unknown - self._paths.keys())

    def _find(self, cgroup_id: int) -> str | None:
        """The path, walking once on a miss."""
        with self._lock:
            if cgroup_id in self._paths or cgroup_id in self._missing:
                return self._paths.get(cgroup_id)
        with self._walking:
            with self._lock:  # another thread's walk may have found it meanwhile
                if cgroup_id in self._paths:
                    return self._paths[cgroup_id]
            self._rebuild()
        with self._lock:
            path = self._paths.get(cgroup_id)
            if path is None:
                self._missing.add(cgroup_id)
            return path

    def _rebuild(self) -> None:
        failures = self._exhaustion.total
        try:
            dev, walked = _walk(self._root, self._exhaustion)
            self._root_error = None
        except OSError as e:
            if self._root_error != e.strerror:  # once, not on every miss
                log.warning(
                    "cgroup root %s unreadable (%s): no pod attribution", self._root, e.strerror
                )
            self._root_error = e.strerror
            dev, walked = None, {}
        partial = self._exhaustion.total != failures
        with self._lock:
            # A partial walk keeps every path known before: what it could not open is unknown.
            for cgroup_id in self._paths if partial else self._unclaimed:
                walked.setdefault(cgroup_id, self._paths[cgroup_id])
            self._paths, self._dev = walked, dev
            self._missing.clear()
            self._partial = partial
            self.rebuilds += 1
        if not partial:
            self._exhaustion.ok()
        if self._on_rebuild is not None:
            self._on_rebuild()

    def _prune(self) -> None:
        now = self._clock()
        with self._lock:
            old = [
                (cgroup_id, self._paths[cgroup_id])
                for cgroup_id, born in self._unclaimed.items()
                if now - born >= _UNCLAIMED_GRACE_SECONDS
            ]
        gone = [cgroup_id for cgroup_id, path in old if not _exists(self._root, path, cgroup_id)]
        with self._lock:
            for cgroup_id in gone:
                if self._unclaimed.pop(cgroup_id, None) is not None:
                    del self._paths[cgroup_id]
            self._prune_at = max(_PRUNE_MIN, 2 * len(self._unclaimed))


def _tree_counters(root: str) -> tuple[int, ...] | None:
    """_TREE_COUNTERS of the root's cgroup.stat; None if it does not read or lacks one."""
    try:
        with open(os.path.join(root, "cgroup.stat")) as f:
            fields = dict(line.split(maxsplit=1) for line in f if line.strip())
        return tuple(int(fields[name]) for name in _TREE_COUNTERS)
    except (OSError, KeyError, ValueError):
        return None


def _exists(root: str, path: str, cgroup_id: int) -> bool:
    try:
        return os.stat(os.path.join(root, path)).st_ino == cgroup_id
    except OSError:
        return False


def _walk(root: str, exhaustion: Exhaustion) -> tuple[int, dict[int, str]]:
    """The root's device and every cgroup under it by id; OSError if root is unreadable.
    A directory that cannot be opened for want of a descriptor is counted in exhaustion."""
    top = os.stat(root)
    paths = {top.st_ino: ""}
    stack = [""]
    while stack:
        for ino, child in _subdirs(root, stack.pop(), top.st_dev, exhaustion):
            paths[ino] = child
            stack.append(child)
    return top.st_dev, paths


def _subdirs(
    root: str, rel: str, dev: int, exhaustion: Exhaustion, inodes: set[int] | None = None
) -> list[tuple[int, str]]:
    """(id, path) of rel's child directories on file system dev (only those with an id in
    `inodes` if given). A directory removed meanwhile has none; one that cannot be opened for
    want of a descriptor is counted in exhaustion (EMFILE made a new pod's walk find nothing,
    unlogged)."""
    found = []
    try:
        with os.scandir(os.path.join(root, rel)) as entries:
            for entry in entries:
                # A cgroup removed during the walk is just skipped.
                try:
                    # readdir's d_ino is cgroupfs's id too, so a birth stats its entries only.
                    if inodes is not None and entry.inode() not in inodes:
                        continue
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    # stat, not DirEntry.inode(): readdir's d_ino can differ from st_ino
                    # (overlayfs, mount points), and the kernel's id is st_ino.
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                # Inode numbers are unique only within one file system: stay on the root's
                # (cgroup v1 and hybrid layouts mount other hierarchies below it).
                if st.st_dev == dev and (inodes is None or st.st_ino in inodes):
                    found.append((st.st_ino, os.path.join(rel, entry.name)))
    except OSError as e:
        if exhausted(e):
            exhaustion.failed()
    return found


class ProcCgroups:
    """The cgroup id (and directory) of a cgroup v2 path as /proc/PID/cgroup writes it, relative
    to the READER's cgroup namespace: in a pod (a private cgroupns) another container's path
    starts with "/..". Such a path is taken from the agent's own namespace root, found once as
    the directory under the cgroup root with the inode of `own_cgroup` (the container's own
    cgroup2 mount, rooted at its namespace root)."""

    def __init__(
        self, cgroup_root: str, own_cgroup: str = "/sys/fs/cgroup", proc: str = "/proc"
    ) -> None:
        self._root = cgroup_root
        self._own = own_cgroup
        self._proc = proc
        self._ns_root: str | None = None  # the agent's cgroupns root, under cgroup_root

    def id_of(self, cgroup: str) -> tuple[int, str] | None:
        """(id, directory) of a /proc/PID/cgroup path; None when it is not there (gone)."""
        relative = cgroup.lstrip("/")
        if relative.startswith(".."):
            relative = os.path.normpath(os.path.join(self._namespace_root(), relative))
            if relative.startswith(".."):
                return None  # above the hierarchy's root: no cgroup_root of the node's
        path = os.path.join(self._root, relative)
        inode = _inode(path)
        return None if inode is None else (inode, path)

    def of_pid(self, pid: int) -> tuple[int, str] | None:
        """The cgroup of a process now (its "0::" line); None when it has exited."""
        try:
            with open(f"{self._proc}/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        path = next((line[3:] for line in lines if line.startswith("0::")), None)
        return None if path is None else self.id_of(path)

    def _namespace_root(self) -> str:
        """The agent's cgroup namespace root, relative to cgroup_root ("." when not found)."""
        if self._ns_root is None:
            self._ns_root = "."
            inode = _inode(self._own)
            for top, dirs, _ in os.walk(self._root) if inode else ():
                found = [d for d in dirs if _inode(os.path.join(top, d)) == inode]
                if found:
                    self._ns_root = os.path.relpath(os.path.join(top, found[0]), self._root)
                    break
        return self._ns_root


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None  # removed meanwhile
