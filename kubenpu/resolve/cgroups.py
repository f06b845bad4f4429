"""cgroup id -> cgroup v2 path.

bpf_get_current_cgroup_id() is the inode number of the process's cgroup v2 directory, so one walk
of the hierarchy maps every id to its path. The walk is redone only when an unknown id shows up.
The kernel also reports each new cgroup with its parent's id (born()): one read of the parent's
directory then indexes it at once, so it stays known after its directory is removed.
"""

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

# Births remembered beyond the walks (their directory may be gone), oldest dropped first: enough
# for the containers started between two reaps of the busiest node.
_BORN_MAX = 4096


class CgroupIndex:
    """born() may run on another thread than the other methods; those run on one thread."""

    def __init__(
        self, root: str = "/sys/fs/cgroup", on_rebuild: Callable[[], None] | None = None
    ) -> None:
        self._root = root
        self._on_rebuild = on_rebuild
        self._paths: dict[int, str] = {}
        # Ids that were missing after the last walk: asking again must not walk again, or a
        # stream of events from one vanished cgroup would walk the tree once per event.
        self._missing: set[int] = set()
        self._root_error: str | None = None
        self.rebuilds = 0
        self._lock = threading.Lock()  # guards _born and _unborn, which born() fills
        self._born: dict[int, str] = {}  # id -> path, from births; kept across walks
        # Births not found in their parent's directory: the kernel reports a new cgroup just
        # before it shows it, so it is looked for again on the first miss.
        self._unborn: dict[int, int] = {}  # id -> parent id

    def path(self, cgroup_id: int) -> str | None:
        """Path relative to the root ("" for the root itself); None if no such cgroup exists."""
        path = self._known(cgroup_id)
        if path is None:
            path = self._find_unborn(cgroup_id)
        if path is None and cgroup_id not in self._missing:
            self._rebuild()
            path = self._known(cgroup_id)
            if path is None:
                self._missing.add(cgroup_id)
        return path

    def born(self, cgroup_id: int, parent_id: int) -> None:
        """Index a new cgroup from one read of its parent's directory (no walk)."""
        parent = self._known(parent_id)
        if parent is None and self.rebuilds == 0:
            self._rebuild()  # the first birth after start: the tree was never walked
            parent = self._known(parent_id)
        path = None if parent is None else self._child(parent, cgroup_id)
        with self._lock:
            if path is not None:
                self._born[cgroup_id] = path
            else:
                self._unborn[cgroup_id] = parent_id
            for held in (self._born, self._unborn):
                if len(held) > _BORN_MAX:
                    del held[next(iter(held))]

    def _known(self, cgroup_id: int) -> str | None:
        path = self._paths.get(cgroup_id)
        if path is None:
            with self._lock:
                path = self._born.get(cgroup_id)
        return path

    def _child(self, parent: str, cgroup_id: int) -> str | None:
        try:
            dev = os.stat(self._root).st_dev
        except OSError:
            return None
        return next((p for ino, p in _subdirs(self._root, parent, dev) if ino == cgroup_id), None)

    def _find_unborn(self, cgroup_id: int) -> str | None:
        with self._lock:
            parent_id = self._unborn.pop(cgroup_id, None)
        if parent_id is None or (parent := self._known(parent_id)) is None:
            return None
        path = self._child(parent, cgroup_id)
        if path is not None:
            with self._lock:
                self._born[cgroup_id] = path
        return path

    def alive(self, cgroup_id: int) -> bool:
        """Whether a known cgroup still exists (one stat; never walks)."""
        path = self._known(cgroup_id)
        if path is None:
            return False
        try:
            return os.stat(os.path.join(self._root, path)).st_ino == cgroup_id
        except OSError:
            return False

    def forget(self, cgroup_id: int) -> None:
        self._paths.pop(cgroup_id, None)
        self._missing.discard(cgroup_id)
        with self._lock:
            self._born.pop(cgroup_id, None)
            self._unborn.pop(cgroup_id, None)

    def _rebuild(self) -> None:
        try:
            self._paths = _walk(self._root)
            self._root_error = None
        except OSError as e:
            if self._root_error != e.strerror:  # once, not on every miss
                log.warning(
                    "cgroup root %s unreadable (%s): no pod attribution", self._root, e.strerror
                )
            self._root_error = e.strerror
            self._paths = {}
        self._missing.clear()
        self.rebuilds += 1
        if self._on_rebuild is not None:
            self._on_rebuild()


def _walk(root: str) -> dict[int, str]:
    """Every cgroup under root by id; OSError if root itself is unreadable."""
    top = os.stat(root)
    paths = {top.st_ino: ""}
    stack = [""]
    while stack:
        for ino, child in _subdirs(root, stack.pop(), top.st_dev):
            paths[ino] = child
            stack.append(child)
    return paths


def _subdirs(root: str, rel: str, dev: int) -> list[tuple[int, str]]:
    """(id, path) of rel's child directories on file system dev."""
    found = []
    try:
        with os.scandir(os.path.join(root, rel)) as entries:
            for entry in entries:
                # A cgroup removed during the walk is just skipped.
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    # stat, not DirEntry.inode(): readdir's d_ino can differ from st_ino
                    # (overlayfs, mount points), and the kernel's id is st_ino.
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                # Inode numbers are unique only within one file system: stay on the root's
                # (cgroup v1 and hybrid layouts mount other hierarchies below it).
                if st.st_dev == dev:
                    found.append((st.st_ino, os.path.join(rel, entry.name)))
    except OSError:
        pass
    return found
