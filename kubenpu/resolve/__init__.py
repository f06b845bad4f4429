"""Attribution: cgroup id -> cgroup path -> container id -> CRI labels -> namespace/pod/container.

A pod-level cgroup (the pod slice itself, or CRI-O's conmon scope) belongs to a pod but to no
container, and the CRI can only name containers: it resolves to empty labels with reason
container_not_found, not not_pod, because the process does run in a pod.
"""

import time
from collections.abc import Callable

from kubenpu.resolve import containers
from kubenpu.resolve.attribution import (
    CONTAINER_NOT_FOUND,
    CRI_ERROR,
    NOT_INDEXED,
    NOT_POD,
    Attribution,
)
from kubenpu.resolve.cgroups import CgroupIndex
from kubenpu.resolve.cri import DEFAULT_ENDPOINT, CriClient, RequestObserver

__all__ = [
    "CONTAINER_NOT_FOUND",
    "CRI_ERROR",
    "DEFAULT_ENDPOINT",
    "NOT_INDEXED",
    "NOT_POD",
    "Attribution",
    "Resolver",
]


class Resolver:
    """Caches one Attribution per cgroup id until forget(); cri_error results are not cached
    (the CRI client backs off instead). Not thread-safe: call from one thread."""

    def __init__(
        self,
        cgroup_root: str = "/sys/fs/cgroup",
        cri_endpoint: str = DEFAULT_ENDPOINT,
        cri_timeout: float = 2.0,
        cri_retry_after: float = 30.0,
        on_rebuild: Callable[[], None] | None = None,
        on_cri_request: RequestObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._index = CgroupIndex(cgroup_root, on_rebuild)
        self._cri = CriClient(cri_endpoint, cri_timeout, cri_retry_after, on_cri_request, clock)
        self._cache: dict[int, Attribution] = {}
        self._container_ids: dict[int, str] = {}  # so forget() can drop the CRI cache entry too

    @property
    def rebuilds(self) -> int:
        return self._index.rebuilds

    def runtime_version(self) -> str | None:
        """The runtime's name and version for a startup log line; None (and a warning) if down."""
        return self._cri.version()

    def resolve(self, cgroup_id: int) -> Attribution:
        if cached := self._cache.get(cgroup_id):
            return cached
        result = self._resolve(cgroup_id)
        if result.reason != CRI_ERROR:
            self._cache[cgroup_id] = result
        return result

    def cgroup_born(self, cgroup_id: int, parent_id: int) -> None:
        """A new cgroup, from the kernel: index it now, while its directory exists. Safe to call
        from another thread than the other methods (minimal version of contract A's method)."""
        self._index.born(cgroup_id, parent_id)

    def alive(self, cgroup_id: int) -> bool:
        return self._index.alive(cgroup_id)

    def forget(self, cgroup_id: int) -> None:
        """Free what is known about a cgroup that is gone."""
        self._cache.pop(cgroup_id, None)
        self._index.forget(cgroup_id)
        if (container_id := self._container_ids.pop(cgroup_id, None)) is not None:
            self._cri.forget(container_id)

    def close(self) -> None:
        self._cri.close()

    def _resolve(self, cgroup_id: int) -> Attribution:
        path = self._index.path(cgroup_id)
        if path is None:
            return Attribution(reason=NOT_INDEXED)
        pod = containers.parse(path)
        if pod is None:
            return Attribution(reason=NOT_POD)
        if pod.container_id is None:
            return Attribution(reason=CONTAINER_NOT_FOUND)
        self._container_ids[cgroup_id] = pod.container_id
        return self._cri.lookup(pod.container_id)
