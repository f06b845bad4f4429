"""Resolver: cgroup id -> cgroup path -> container id -> CRI labels -> namespace/pod/container,
as an Attribution, with the CRI lookups in a thread pool.

A pod-level cgroup (the pod slice itself, or CRI-O's conmon scope) belongs to a pod but to no
container, and the CRI can only name containers: it resolves to empty labels with reason
container_not_found, not not_pod, because the process does run in a pod.

CRI requests never run on the caller's thread. They run in a small thread pool: the sync gRPC
stub is thread-safe and blocking calls with a deadline are simple to bound, where grpc.aio would
need an event loop thread of its own for the same result.

The first lookup asks the runtime for its list of containers (ListContainers) before its own
container: an agent that starts on a node with many pods (a restart adopting the counts of 1,000
pods' cgroups) gets their names from one request instead of one ContainerStatus each. A
container the list lacks (created since) is looked up alone.
"""

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from kubenpu.resolve import DEFAULT_ENDPOINT, containers
from kubenpu.resolve.cgroups import CgroupIndex
from kubenpu.resolve.cri import CriClient, RequestObserver, Sandbox
from kubenpu.resolve.result import Attribution, Unattributed

log = logging.getLogger(__name__)

# A container the runtime did not know, or a runtime that did not answer, is asked again this
# long after the previous lookup started, doubling up to cri_retry_after: a container is often
# created a moment before the runtime lists it. (While the runtime is down the CriClient sends
# nothing for cri_retry_after anyway.)
_FIRST_RETRY_SECONDS = 1.0
_RETRIED = (Unattributed.CONTAINER_NOT_FOUND, Unattributed.CRI_ERROR)


@dataclass
class _Lookup:
    """One container id's CRI lookups, shared by the cgroups in that container."""

    cgroups: set[int] = field(default_factory=set)
    future: Future[Attribution] | None = None
    answer: Attribution | None = None  # final: what the runtime said
    failure: Attribution | None = None  # the last retried answer
    started: float = 0.0  # when the last lookup was started
    retry_at: float = 0.0
    delay: float = _FIRST_RETRY_SECONDS


class Resolver:
    """One Attribution per cgroup id, cached until forget() once final.

    resolve(), settle(), alive() and forget() are called from one thread (the caller's);
    cgroups_born() may be called from another.
    """

    def __init__(
        self,
        cgroup_root: str = "/sys/fs/cgroup",
        cri_endpoint: str = DEFAULT_ENDPOINT,
        cri_timeout: float = 2.0,
        cri_retry_after: float = 30.0,
        *,
        concurrency: int = 4,
        on_rebuild: Callable[[], None] | None = None,
        on_cri_request: RequestObserver | None = None,
        on_answer: Callable[[], None] | None = None,
        on_exhausted: Callable[[str, int], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """on_answer: called (on a pool thread) whenever a CRI lookup has finished, so a caller
        holding counts for it can take the answer at once."""
        self._cgroup_root = cgroup_root
        self._index = CgroupIndex(cgroup_root, on_rebuild, clock, on_exhausted)
        self._cri = CriClient(cri_endpoint, cri_timeout, cri_retry_after, on_cri_request, clock)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="kubenpu-cri")
        self._closed = False
        self._max_delay = max(cri_retry_after, _FIRST_RETRY_SECONDS)
        self._clock = clock
        self._on_answer = on_answer
        self._answers: dict[int, Attribution] = {}  # final answers per cgroup
        self._container_ids: dict[int, str] = {}  # cgroups waiting for (or given) a CRI answer
        self._path_uids: dict[int, str] = {}  # their pod uids, as their cgroup paths give them
        self._lookups: dict[str, _Lookup] = {}  # per container id, while a cgroup refers to it
        self._list_lock = threading.Lock()  # pool threads wait for the one list
        # The list's answers not taken yet: at most the containers on the node when it was asked.
        self._listed: dict[str, Attribution] | None = None

    @property
    def rebuilds(self) -> int:
        return self._index.rebuilds

    def runtime_version(self) -> str | None:
        """The runtime's name and version for a startup log line; None (and a warning) if down.
        Blocks up to the CRI timeout: call it off the counting path."""
        return self._cri.version()

    def pod_uids(self) -> dict[tuple[str, str], str] | None:
        """The running pods' uids by (namespace, name) (CriClient.pod_uids): for the allocation
        series, whose PodResources answer has none."""
        return self._cri.pod_uids()

    def sandboxes(self) -> dict[tuple[str, str], Sandbox] | None:
        """The running pods' uids, labels and annotations by (namespace, name)
        (CriClient.sandboxes): for the guard's policy."""
        return self._cri.sandboxes()

    def resolve(self, cgroup_id: int) -> Attribution | None:
        """The answer if known, else None ("pending") while a CRI lookup runs or waits to be
        retried. Never waits on the CRI."""
        if (known := self._answers.get(cgroup_id)) is not None:
            return known
        container_id = self._container_ids.get(cgroup_id)
        if container_id is None:
            local = self._local(cgroup_id)
            if isinstance(local, Attribution):
                self._answers[cgroup_id] = local
                return local
            container_id = self._container_ids[cgroup_id] = local[0]
            self._path_uids[cgroup_id] = local[1]
        lookup = self._lookups.setdefault(container_id, _Lookup())
        lookup.cgroups.add(cgroup_id)
        answer = self._poll(container_id, lookup)
        if answer is not None:
            answer = self._answers[cgroup_id] = self._with_uid(cgroup_id, answer)
        return answer

    def _with_uid(self, cgroup_id: int, answer: Attribution) -> Attribution:
        """The CRI's answer, with the cgroup path's pod uid if the runtime's labels lack one (a
        runtime that does not copy io.kubernetes.pod.uid): a pod is never left without it."""
        if answer.pod and not answer.pod_uid:
            return replace(answer, pod_uid=self._path_uids.get(cgroup_id, ""))
        return answer

    def prefetch(self, cgroup_ids: Iterable[int]) -> None:
        """Index the cgroups about to be resolved with one walk of the tree at most, for all
        those it does not know: their resolve() then walks no more."""
        # Each id tested, not a set of every known one made: a flush at idle asks about none.
        answers, containers = self._answers, self._container_ids
        unknown = [c for c in cgroup_ids if c not in answers and c not in containers]
        if unknown:
            self._index.index(unknown)

    def settle(self, cgroup_id: int) -> Attribution:
        """The best answer now, for a caller that stops waiting: the last failure (cri_error
        if the first lookup has not answered yet). Not cached: resolve() keeps trying."""
        answer = self.resolve(cgroup_id)
        if answer is not None:
            return answer
        lookup = self._lookups[self._container_ids[cgroup_id]]
        return lookup.failure or Attribution(reason=Unattributed.CRI_ERROR)

    def cgroups_born(self, births: Iterable[tuple[int, int]]) -> None:
        """New cgroups (id, parent id) from the kernel: index them now, so they stay
        attributable even if their directories are removed right after. Cheap (one scan per
        parent, no walk once the index is built, no CRI); safe to call from another thread."""
        self._index.cgroups_born(births)

    def alive(self, cgroup_id: int) -> bool:
        return self._index.alive(cgroup_id)

    def path(self, cgroup_id: int) -> str | None:
        """The cgroup's directory (under the cgroup root), None if no such cgroup exists."""
        found = self._index.path(cgroup_id)
        return None if found is None else os.path.join(self._cgroup_root, found)

    def removed(self) -> bool:
        """Whether a cgroup may have been removed since the last True (CgroupIndex.removed)."""
        return self._index.removed()

    def forget(self, cgroup_id: int) -> None:
        """Free what is known about a cgroup that is gone."""
        self._answers.pop(cgroup_id, None)
        self._index.forget(cgroup_id)
        container_id = self._container_ids.pop(cgroup_id, None)
        self._path_uids.pop(cgroup_id, None)
        lookup = self._lookups.get(container_id) if container_id is not None else None
        if lookup is not None:
            lookup.cgroups.discard(cgroup_id)
            if not lookup.cgroups:
                del self._lookups[container_id]
                if lookup.future is not None:
                    lookup.future.cancel()  # if still queued; a running one just ends

    def close(self) -> None:
        """Stops the lookups: queued ones are dropped, running ones cancelled by closing the
        channel, so this returns within the CRI timeout at worst."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._cri.close()
        self._pool.shutdown(wait=True)

    def _local(self, cgroup_id: int) -> Attribution | tuple[str, str]:
        """The final answer the cgroup tree gives, or the container id to ask the CRI about
        and the pod uid in the path."""
        path = self._index.path(cgroup_id)
        if path is None:
            return Attribution(reason=Unattributed.NOT_INDEXED)
        pod = containers.parse(path)
        if pod is None:
            return Attribution(reason=Unattributed.NOT_POD)
        if pod.container_id is None:
            return Attribution(reason=Unattributed.CONTAINER_NOT_FOUND)
        return pod.container_id, pod.pod_uid

    def _poll(self, container_id: str, lookup: _Lookup) -> Attribution | None:
        """A finished lookup's answer; starts one when none runs and a retry is due."""
        if lookup.answer is not None:
            return lookup.answer
        if lookup.future is not None:
            if not lookup.future.done():
                return None
            answer = _result(lookup.future)
            lookup.future = None
            if answer.reason not in _RETRIED:
                lookup.answer = answer
                return answer
            lookup.failure = answer
            self._schedule_retry(lookup)
        now = self._clock()
        if not self._closed and now >= lookup.retry_at:
            lookup.started = now
            lookup.future = self._pool.submit(self._lookup, container_id)
            if self._on_answer is not None:
                on_answer = self._on_answer
                lookup.future.add_done_callback(lambda _: on_answer())
        return None

    def _schedule_retry(self, lookup: _Lookup) -> None:
        """While the CRI client backs off it sends nothing: the retry is when it sends again, and
        the delay is not doubled for a lookup that asked no one. (Doubling on those once put the
        first real retry after a timeout at start a minute past the back-off: a busy pod's calls
        were held for 1.5 minutes.) Else from the start, not from when this thread looked: the
        same whenever it looks."""
        resumes = self._cri.sends_again_at()
        if resumes > self._clock():
            lookup.retry_at = resumes
            return
        lookup.retry_at = lookup.started + lookup.delay
        lookup.delay = min(lookup.delay * 2, self._max_delay)

    def _lookup(self, container_id: str) -> Attribution:
        """On a pool thread: the answer of the runtime's list (asked for by the first lookup
        only), else of the container's own status."""
        with self._list_lock:
            if self._listed is None:
                self._listed = self._cri.containers()
            listed = self._listed.pop(container_id, None)
        return listed if listed is not None else self._cri.lookup(container_id)


def _result(future: Future[Attribution]) -> Attribution:
    """A lookup's answer; a bug in it reads as cri_error (logged), never as a traceback here."""
    if future.cancelled():  # by close()
        return Attribution(reason=Unattributed.CRI_ERROR)
    try:
        return future.result()
    except Exception as e:  # anything the gRPC stack raises besides RpcError
        log.warning("CRI lookup failed: %r", e)
        return Attribution(reason=Unattributed.CRI_ERROR)
