import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_server import CriTestServer
from fakes import Clock
from helpers import eventually, resolved

from kubenpu.resolve import Attribution, Unattributed
from kubenpu.resolve.cri import CriClient
from kubenpu.resolve.resolver import Resolver

UID = "0e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
WORKER = "1" * 64
SIDECAR = "2" * 64
UNKNOWN = "3" * 64  # a container cgroup the runtime does not know
BARRIER = "f" * 64  # see barrier()

NOT_FOUND = Attribution(reason=Unattributed.CONTAINER_NOT_FOUND)
CRI_ERROR = Attribution(reason=Unattributed.CRI_ERROR)

# Where kubelet and the runtime put a pod's cgroups under each cgroup driver.
LAYOUTS = {
    "systemd": (
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice",
        "cri-containerd-{id}.scope",
    ),
    "cgroupfs": ("kubepods/burstable/pod{uid}", "{id}"),
}


class Tree:
    """A cgroup v2 tree in a temporary directory: ids are the directories' real inode numbers."""

    def __init__(self, root: Path, layout: str) -> None:
        self.root = root
        pod, self._container = LAYOUTS[layout]
        self.pod = pod.format(uid=UID, uid_=UID.replace("-", "_"))
        self.mkdir(self.pod)
        self.mkdir("system.slice/sshd.service")

    def mkdir(self, rel: str) -> int:
        (self.root / rel).mkdir(parents=True, exist_ok=True)
        return os.stat(self.root / rel).st_ino

    def container(self, container_id: str) -> str:
        return f"{self.pod}/{self._container.format(id=container_id)}"


@pytest.fixture(params=sorted(LAYOUTS))
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Tree:
    return Tree(tmp_path / "cgroup", request.param)


@pytest.fixture
def server(cri: CriTestServer) -> CriTestServer:
    server = cri
    server.add_container(WORKER, "ml", "trainer-0", "worker", pod_uid=UID)
    server.add_container(SIDECAR, "ml", "trainer-0", "sidecar", pod_uid=UID)
    server.add_container(BARRIER, "ml", "trainer-0", "barrier", pod_uid=UID)
    # The tests below are about single lookups: a runtime without ListContainers, so every
    # container is looked up alone (the list has its own tests at the end).
    server.listed = False
    return server


@pytest.fixture
def clock() -> Clock:
    return Clock(0.0)


@pytest.fixture
def resolver(tree: Tree, cri_socket: str, clock: Clock) -> Iterator[Resolver]:
    # One lookup at a time, so barrier() can tell that no other lookup was started.
    resolver = Resolver(
        str(tree.root), f"unix://{cri_socket}", 5.0, 30.0, concurrency=1, clock=clock
    )
    yield resolver
    resolver.close()


def barrier(resolver: Resolver, tree: Tree) -> None:
    """Returns once every lookup started before it has ended: with concurrency=1 the pool runs
    lookups in order, and this one is the last."""
    cgroup_id = tree.mkdir(tree.container(BARRIER) + f"/{len(os.listdir(tree.root))}")
    os.rename(tree.root / tree.container(BARRIER), tree.root.parent / f"b{cgroup_id}")
    resolver.cgroups_born([(cgroup_id, 0)])  # parent unknown: walks, finds nothing
    assert resolved(resolver, tree.mkdir(tree.container(BARRIER))).container == "barrier"


def settled_as(resolver: Resolver, cgroup_id: int, expected: Attribution) -> None:
    """Waits until the first lookup has answered with `expected`."""
    eventually(lambda: resolver.settle(cgroup_id) == expected, f"settle() == {expected}")


def test_containers_resolve(tree: Tree, server: CriTestServer, resolver: Resolver) -> None:
    worker, sidecar = tree.mkdir(tree.container(WORKER)), tree.mkdir(tree.container(SIDECAR))
    assert resolver.resolve(worker) is None  # pending: the lookup runs off this thread
    assert resolved(resolver, worker) == Attribution("ml", "trainer-0", "worker", pod_uid=UID)
    assert resolved(resolver, sidecar) == Attribution("ml", "trainer-0", "sidecar", pod_uid=UID)
    assert resolver.rebuilds == 1


def test_the_pod_uid_is_the_cris_else_the_cgroup_paths(
    tree: Tree, server: CriTestServer, resolver: Resolver
) -> None:
    """The runtime's io.kubernetes.pod.uid label names the pod; a runtime that does not copy
    it still gives the pod its uid, from the pod's cgroup directory."""
    cris, bare = "1" * 64, "2" * 64
    server.add_container(cris, "ml", "trainer-0", "a", pod_uid="cri-uid")
    server.add_container(bare, "ml", "trainer-0", "b")
    assert resolved(resolver, tree.mkdir(tree.container(cris))).pod_uid == "cri-uid"
    assert resolved(resolver, tree.mkdir(tree.container(bare))).pod_uid == UID


def test_partial_reasons(tree: Tree, server: CriTestServer, resolver: Resolver) -> None:
    host = tree.mkdir("system.slice/sshd.service")
    pod = tree.mkdir(tree.pod)
    unknown = tree.mkdir(tree.container(UNKNOWN))
    outside = os.stat(tree.root.parent).st_ino
    # What the cgroup tree decides is final at once, without the CRI.
    assert resolver.resolve(host) == Attribution(reason="not_pod")
    assert resolver.resolve(pod) == Attribution(reason="container_not_found")
    assert resolver.resolve(outside) == Attribution(reason="not_indexed")
    assert resolver.resolve(host).reason is Unattributed.NOT_POD
    # The runtime not knowing a container is retried: pending, and settle() says why.
    assert resolver.resolve(unknown) is None
    settled_as(resolver, unknown, Attribution(reason="container_not_found"))
    assert resolver.resolve(unknown) is None


def test_answers_are_cached(tree: Tree, server: CriTestServer, resolver: Resolver) -> None:
    worker = tree.mkdir(tree.container(WORKER))
    nested = tree.mkdir(tree.container(WORKER) + "/init")  # same container, own sub-cgroup
    unknown = tree.mkdir(tree.container(UNKNOWN))
    outside = os.stat(tree.root.parent).st_ino
    for _ in range(3):
        for cgroup_id in (worker, nested, unknown, outside):
            resolver.resolve(cgroup_id)
    assert resolved(resolver, worker).container == "worker"
    assert resolved(resolver, nested).container == "worker"
    settled_as(resolver, unknown, NOT_FOUND)
    for cgroup_id in (worker, nested, unknown, outside):
        resolver.resolve(cgroup_id)
    server.requests.pop(BARRIER, None)
    assert server.requests == {WORKER: 1, UNKNOWN: 1}
    assert resolver.rebuilds == 2  # the first lookup, then the one miss


def test_not_found_is_retried_with_back_off(
    tree: Tree, server: CriTestServer, resolver: Resolver, clock: Clock
) -> None:
    """A container the runtime does not know yet for a moment is attributed once it does
    (it used to stay container_not_found for the cgroup's life)."""
    late = tree.mkdir(tree.container(UNKNOWN))
    assert resolver.resolve(late) is None
    settled_as(resolver, late, NOT_FOUND)
    assert resolver.resolve(late) is None
    barrier(resolver, tree)
    assert server.requests[UNKNOWN] == 1  # not asked again before the back-off

    clock.now += 1  # the first retry, still unknown: the next one waits twice as long
    assert resolver.resolve(late) is None
    eventually(lambda: server.requests[UNKNOWN] == 2, "second lookup")
    settled_as(resolver, late, NOT_FOUND)
    clock.now += 1
    assert resolver.resolve(late) is None
    barrier(resolver, tree)
    assert server.requests[UNKNOWN] == 2

    server.add_container(UNKNOWN, "ml", "trainer-0", "late", pod_uid=UID)
    clock.now += 1
    assert resolved(resolver, late) == Attribution("ml", "trainer-0", "late", pod_uid=UID)
    assert server.requests[UNKNOWN] == 3


def test_cri_error_is_retried_after_back_off(
    tree: Tree, server: CriTestServer, clock: Clock, tmp_path: Path
) -> None:
    requests: list[bool] = []
    sock = str(tmp_path / "cri.sock")
    resolver = Resolver(
        str(tree.root),
        sock,
        5.0,
        30.0,
        on_cri_request=lambda _, ok: requests.append(ok),
        clock=clock,
    )
    worker = tree.mkdir(tree.container(WORKER))
    server.stop()
    assert resolver.resolve(worker) is None
    eventually(lambda: requests == [False], "the failed request")
    server.start(sock)
    assert resolver.resolve(worker) is None
    assert resolver.settle(worker) == Attribution(reason="cri_error")
    clock.now += 31
    assert resolved(resolver, worker) == Attribution("ml", "trainer-0", "worker", pod_uid=UID)
    assert requests == [False, True]
    assert resolver.rebuilds == 1
    resolver.close()


def test_slow_cri_never_delays_a_known_pod(
    tree: Tree, server: CriTestServer, tmp_path: Path
) -> None:
    """A CRI answering slowly (under its timeout) while 20 new pods arrive: a known pod's
    resolve() answers while their lookups are in flight, at most `concurrency` at once."""
    resolver = Resolver(str(tree.root), str(tmp_path / "cri.sock"), 60.0, concurrency=4)
    try:
        known = tree.mkdir(tree.container(WORKER))
        assert resolved(resolver, known).container == "worker"
        new = {f"{i:064x}": tree.mkdir(tree.container(f"{i:064x}")) for i in range(100, 120)}
        for container_id in new:
            server.add_container(container_id, "ml", f"pod-{container_id[-2:]}", "c", UID)
        server.hold()
        assert all(resolver.resolve(c) is None for c in new.values())
        assert server.wait_in_flight(4)
        assert resolver.resolve(known) == Attribution("ml", "trainer-0", "worker", pod_uid=UID)
        assert resolver.resolve(tree.mkdir("system.slice/sshd.service")).reason == "not_pod"
        assert all(resolver.resolve(c) is None for c in new.values())
        assert server.in_flight == 4
        server.release()
        for container_id, cgroup_id in new.items():
            assert resolved(resolver, cgroup_id).pod == f"pod-{container_id[-2:]}"
        assert server.max_in_flight == 4
        assert all(server.requests[c] == 1 for c in new)
    finally:
        server.release()
        resolver.close()


def test_settle_gives_the_best_answer_now(
    tree: Tree, server: CriTestServer, resolver: Resolver
) -> None:
    worker, host = tree.mkdir(tree.container(WORKER)), tree.mkdir("system.slice/sshd.service")
    assert resolver.settle(host) == Attribution(reason="not_pod")
    server.hold()
    assert resolver.settle(worker) == CRI_ERROR  # no answer yet: the runtime is late
    assert server.wait_in_flight(1)
    assert resolver.settle(worker) == CRI_ERROR
    server.release()
    assert resolved(resolver, worker).pod == "trainer-0"
    assert resolver.settle(worker).pod == "trainer-0"


def test_short_lived_container_is_attributed_after_its_cgroup_is_gone(
    tree: Tree, server: CriTestServer, resolver: Resolver
) -> None:
    """The kernel reports a new cgroup; the container runs, exits and its cgroup is removed
    before the first call is resolved (it used to be not_indexed)."""
    pod = tree.mkdir(tree.pod)
    assert resolver.resolve(pod) == Attribution(reason="container_not_found")  # index built
    rebuilds = resolver.rebuilds
    container = tree.mkdir(tree.container(SIDECAR))
    resolver.cgroups_born([(container, pod)])
    os.rename(tree.root / tree.container(SIDECAR), tree.root.parent / "gone")  # keeps the inode
    assert resolved(resolver, container) == Attribution("ml", "trainer-0", "sidecar", pod_uid=UID)
    assert not resolver.alive(container)
    assert resolver.rebuilds == rebuilds


def test_lifecycle(tree: Tree, server: CriTestServer, resolver: Resolver) -> None:
    worker = tree.mkdir(tree.container(WORKER))
    assert resolved(resolver, worker).pod == "trainer-0"
    assert resolver.alive(worker)
    (tree.root / tree.container(WORKER)).rmdir()
    assert not resolver.alive(worker)
    resolver.forget(worker)
    assert resolver.resolve(worker) == Attribution(reason="not_indexed")
    assert server.requests[WORKER] == 1


def test_forgotten_container_is_asked_again(
    tree: Tree, server: CriTestServer, resolver: Resolver
) -> None:
    worker = tree.mkdir(tree.container(WORKER))
    assert resolved(resolver, worker).container == "worker"
    (tree.root / tree.container(WORKER)).rename(tree.root.parent / "old")
    resolver.forget(worker)
    again = tree.mkdir(tree.container(WORKER))  # same container id, new cgroup
    assert resolved(resolver, again).container == "worker"
    assert server.requests[WORKER] == 2


def test_observers(tree: Tree, server: CriTestServer, tmp_path: Path) -> None:
    rebuilds: list[int] = []
    requests: list[bool] = []
    resolver = Resolver(
        str(tree.root),
        str(tmp_path / "cri.sock"),
        on_rebuild=lambda: rebuilds.append(1),
        on_cri_request=lambda seconds, ok: requests.append(ok),
    )
    resolved(resolver, tree.mkdir(tree.container(WORKER)))
    unknown = tree.mkdir(tree.container(UNKNOWN))
    resolver.resolve(unknown)
    settled_as(resolver, unknown, NOT_FOUND)
    resolver.close()
    assert len(rebuilds) == 2
    assert requests == [True, True, True]  # the list (UNIMPLEMENTED is an answer), two lookups


def test_no_runtime_never_raises(tree: Tree, tmp_path: Path) -> None:
    resolver = Resolver(str(tree.root), str(tmp_path / "absent.sock"), cri_timeout=5.0)
    worker = tree.mkdir(tree.container(WORKER))
    assert resolver.resolve(worker) is None
    settled_as(resolver, worker, Attribution(reason="cri_error"))
    assert resolver.runtime_version() is None
    resolver.close()


def test_close_ends_running_lookups(tree: Tree, server: CriTestServer, tmp_path: Path) -> None:
    """close() with lookups held by the runtime returns (the CRI timeout here is an hour),
    and the resolver answers without raising afterwards."""
    resolver = Resolver(str(tree.root), str(tmp_path / "cri.sock"), 3600.0, concurrency=2)
    cgroups = [tree.mkdir(tree.container(c)) for c in (WORKER, SIDECAR, UNKNOWN)]
    server.hold()
    assert all(resolver.resolve(c) is None for c in cgroups)
    assert server.wait_in_flight(2)
    closing = threading.Thread(target=resolver.close)
    closing.start()
    closing.join(60)
    try:
        assert not closing.is_alive()
        assert resolver.resolve(cgroups[0]) is None
        assert resolver.settle(cgroups[2]) == CRI_ERROR
    finally:
        server.release()


def test_a_lookup_that_raises_reads_as_cri_error(
    tree: Tree,
    server: CriTestServer,  # answers the list, so the only warning is the lookup's
    resolver: Resolver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Faked: no real gRPC stub raises anything but RpcError or ValueError (both handled)."""

    def broken(self: CriClient, container_id: str) -> Attribution:
        raise RuntimeError("bug")

    monkeypatch.setattr(CriClient, "lookup", broken)
    worker = tree.mkdir(tree.container(WORKER))
    assert resolver.resolve(worker) is None
    with caplog.at_level(logging.WARNING):
        eventually(
            lambda: resolver.settle(worker) == CRI_ERROR and len(caplog.records) > 0, "harvest"
        )
    assert [r.getMessage() for r in caplog.records] == ["CRI lookup failed: RuntimeError('bug')"]


def test_the_first_lookup_takes_every_name_from_the_runtimes_list(tree, server, resolver):
    server.listed = True
    worker, sidecar = tree.mkdir(tree.container(WORKER)), tree.mkdir(tree.container(SIDECAR))
    assert resolved(resolver, worker) == Attribution("ml", "trainer-0", "worker", pod_uid=UID)
    assert resolved(resolver, sidecar) == Attribution("ml", "trainer-0", "sidecar", pod_uid=UID)
    assert server.lists == 1 and server.requests == {}
    # A container the list lacks (created since) is looked up alone; the list is not asked again.
    server.add_container(UNKNOWN, "ml", "trainer-0", "late", pod_uid=UID)
    late = tree.mkdir(tree.container(UNKNOWN))
    assert resolved(resolver, late) == Attribution("ml", "trainer-0", "late", pod_uid=UID)
    assert server.lists == 1 and server.requests == {UNKNOWN: 1}


def _noting_failures(tree, tmp_path, clock) -> tuple[Resolver, threading.Event]:
    """A resolver of the test runtime whose failed CRI requests set the event."""
    failed = threading.Event()
    resolver = Resolver(
        str(tree.root),
        f"unix://{tmp_path}/cri.sock",
        clock=clock,
        on_cri_request=lambda seconds, ok: ok or failed.set(),
    )
    return resolver, failed


def test_a_runtime_down_at_the_list_is_retried_with_single_lookups(tree, server, tmp_path, clock):
    server.listed = True
    server.set_unavailable()
    resolver, failed = _noting_failures(tree, tmp_path, clock)
    try:
        worker = tree.mkdir(tree.container(WORKER))
        assert resolver.resolve(worker) is None
        assert failed.wait(30)
        settled_as(resolver, worker, CRI_ERROR)
        server.set_unavailable(False)
        clock.now += 30  # the CRI client's back-off after the failed list
        assert resolved(resolver, worker) == Attribution("ml", "trainer-0", "worker", pod_uid=UID)
        assert server.lists == 1 and server.requests == {WORKER: 1}
    finally:
        resolver.close()


def test_every_finished_lookup_is_announced(tree, server, tmp_path):
    answered = threading.Semaphore(0)
    resolver = Resolver(str(tree.root), f"unix://{tmp_path}/cri.sock", on_answer=answered.release)
    try:
        worker, unknown = tree.mkdir(tree.container(WORKER)), tree.mkdir(tree.container(UNKNOWN))
        assert resolver.resolve(worker) is None and resolver.resolve(unknown) is None
        assert answered.acquire(timeout=30) and answered.acquire(timeout=30)
        assert resolver.resolve(worker) == Attribution("ml", "trainer-0", "worker", pod_uid=UID)
        assert resolver.settle(unknown) == NOT_FOUND
    finally:
        resolver.close()


def _idle(resolver: Resolver) -> bool:
    """No lookup in flight (the resolver's own table: no answer announces a skipped one)."""
    return all(x.future is None or x.future.done() for x in resolver._lookups.values())


def test_a_timeout_at_start_is_retried_when_the_back_off_ends_not_a_minute_later(
    tree, server, tmp_path, clock
):
    """One CRI failure at start backs the client off for retry_after (30 s). The lookups made
    meanwhile send nothing, but each doubled the next retry's delay (1, 2, 4, 8, 16, 30 s), so
    the first real retry came at 31 s here, and a minute after the back-off where the failure
    came a moment later: a busy pod's calls were held for 1.5 minutes on a real kernel."""
    server.set_unavailable()
    resolver, failed = _noting_failures(tree, tmp_path, clock)
    try:
        worker = tree.mkdir(tree.container(WORKER))
        assert resolver.resolve(worker) is None
        assert failed.wait(30)
        eventually(lambda: _idle(resolver), "the failed lookup done")
        server.set_unavailable(False)
        for _ in range(29):  # the agent's flushes look every 0.5 s; every second here
            clock.now += 1
            assert resolver.resolve(worker) is None
            eventually(lambda: _idle(resolver), "the lookup done")
        clock.now += 1  # 30 s: the client's back-off ends
        assert resolved(resolver, worker) == Attribution("ml", "trainer-0", "worker", pod_uid=UID)
    finally:
        resolver.close()
