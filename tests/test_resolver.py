import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from cri_server import CriTestServer

from kubenpu.resolve import Attribution, Resolver

UID = "0e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
WORKER = "1" * 64
SIDECAR = "2" * 64
UNKNOWN = "3" * 64  # a container cgroup the runtime does not know

# Where kubelet and the runtime put a pod's cgroups under each cgroup driver.
LAYOUTS = {
    "systemd": (
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice",
        "cri-containerd-{id}.scope",
    ),
    "cgroupfs": ("kubepods/burstable/pod{uid}", "{id}"),
}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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
def server(tmp_path: Path) -> Iterator[CriTestServer]:
    server = CriTestServer()
    server.start(str(tmp_path / "cri.sock"))
    server.add_container(WORKER, "ml", "trainer-0", "worker", pod_uid=UID)
    server.add_container(SIDECAR, "ml", "trainer-0", "sidecar", pod_uid=UID)
    yield server
    server.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def resolver(tree: Tree, tmp_path: Path, clock: Clock) -> Iterator[Resolver]:
    resolver = Resolver(str(tree.root), f"unix://{tmp_path}/cri.sock", 5.0, 30.0, clock=clock)
    yield resolver
    resolver.close()


def test_containers_resolve(tree: Tree, server: CriTestServer, resolver: Resolver) -> None:
    worker, sidecar = tree.mkdir(tree.container(WORKER)), tree.mkdir(tree.container(SIDECAR))
    assert resolver.resolve(worker) == Attribution("ml", "trainer-0", "worker")
    assert resolver.resolve(sidecar) == Attribution("ml", "trainer-0", "sidecar")
    assert resolver.rebuilds == 1


def test_partial_reasons(tree: Tree, server: CriTestServer, resolver: Resolver) -> None:
    host = tree.mkdir("system.slice/sshd.service")
    pod = tree.mkdir(tree.pod)
    unknown = tree.mkdir(tree.container(UNKNOWN))
    outside = os.stat(tree.root.parent).st_ino
    assert resolver.resolve(host) == Attribution(reason="not_pod")
    assert resolver.resolve(pod) == Attribution(reason="container_not_found")
    assert resolver.resolve(unknown) == Attribution(reason="container_not_found")
    assert resolver.resolve(outside) == Attribution(reason="not_indexed")


def test_answers_are_cached(tree: Tree, server: CriTestServer, resolver: Resolver) -> None:
    worker = tree.mkdir(tree.container(WORKER))
    nested = tree.mkdir(tree.container(WORKER) + "/init")  # same container, own sub-cgroup
    unknown = tree.mkdir(tree.container(UNKNOWN))
    outside = os.stat(tree.root.parent).st_ino
    for _ in range(3):
        for cgroup_id in (worker, nested, unknown, outside):
            resolver.resolve(cgroup_id)
    assert resolver.resolve(nested).container == "worker"
    assert server.requests == {WORKER: 1, UNKNOWN: 1}
    assert resolver.rebuilds == 2  # the first lookup, then the one miss


def test_cri_error_is_retried_after_back_off(
    tree: Tree, server: CriTestServer, resolver: Resolver, clock: Clock, tmp_path: Path
) -> None:
    worker = tree.mkdir(tree.container(WORKER))
    server.stop()
    assert resolver.resolve(worker) == Attribution(reason="cri_error")
    server.start(str(tmp_path / "cri.sock"))
    assert resolver.resolve(worker) == Attribution(reason="cri_error")
    clock.now += 31
    assert resolver.resolve(worker) == Attribution("ml", "trainer-0", "worker")
    assert resolver.rebuilds == 1


def test_lifecycle(tree: Tree, server: CriTestServer, resolver: Resolver) -> None:
    worker = tree.mkdir(tree.container(WORKER))
    assert resolver.resolve(worker).pod == "trainer-0"
    assert resolver.alive(worker)
    (tree.root / tree.container(WORKER)).rmdir()
    assert not resolver.alive(worker)
    resolver.forget(worker)
    assert resolver.resolve(worker) == Attribution(reason="not_indexed")
    assert server.requests[WORKER] == 1


def test_observers(tree: Tree, server: CriTestServer, tmp_path: Path) -> None:
    rebuilds: list[int] = []
    requests: list[bool] = []
    resolver = Resolver(
        str(tree.root),
        str(tmp_path / "cri.sock"),
        on_rebuild=lambda: rebuilds.append(1),
        on_cri_request=lambda seconds, ok: requests.append(ok),
    )
    resolver.resolve(tree.mkdir(tree.container(WORKER)))
    resolver.resolve(tree.mkdir(tree.container(UNKNOWN)))
    resolver.close()
    assert len(rebuilds) == 2
    assert requests == [True, True]


def test_no_runtime_never_raises(tree: Tree, tmp_path: Path) -> None:
    resolver = Resolver(str(tree.root), str(tmp_path / "absent.sock"), cri_timeout=5.0)
    assert resolver.resolve(tree.mkdir(tree.container(WORKER))) == Attribution(reason="cri_error")
    assert resolver.runtime_version() is None
    resolver.close()
