"""Cgroup births (the kernel's cgroup_mkdir records): a cgroup is indexed from its parent's
directory when it is born, so it stays attributable after its directory is removed."""

import os
import struct
from pathlib import Path

import pytest

from kubenpu.events import Birth, route
from kubenpu.resolve import CONTAINER_NOT_FOUND, NOT_INDEXED, Resolver
from kubenpu.resolve.cgroups import CgroupIndex

UID = "0b8f1a52_6c5e_4d0e_9a11_3f5a0c2b7e01"
POD = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID}.slice"
CONTAINER = f"{POD}/cri-containerd-{'a' * 64}.scope"


def ino(path: Path) -> int:
    return os.stat(path).st_ino


def vanish(root: Path, path: Path) -> None:
    """Remove a cgroup from the tree. Moved out rather than removed: tmpfs would hand its inode
    number to the next directory made, and a test must not confuse the two."""
    path.rename(root.parent / f"gone-{ino(path)}")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "cgroup").mkdir()
    return tmp_path / "cgroup"


def test_a_born_cgroup_keeps_its_path_after_removal(root: Path) -> None:
    (root / POD).mkdir(parents=True)
    index = CgroupIndex(str(root))
    index.path(ino(root / POD))  # the tree is walked once
    child = root / CONTAINER
    child.mkdir()
    cid = ino(child)
    index.born(cid, ino(root / POD))
    vanish(root, child)
    assert index.path(cid) == CONTAINER
    assert index.rebuilds == 1  # indexed from the parent's directory, not by a walk
    assert not index.alive(cid)
    index.forget(cid)
    assert index.path(cid) is None


def test_the_first_birth_walks_once_to_learn_its_parent(root: Path) -> None:
    (root / CONTAINER).mkdir(parents=True)
    index = CgroupIndex(str(root))
    index.born(ino(root / CONTAINER), ino(root / POD))
    assert index.rebuilds == 1
    vanish(root, root / CONTAINER)
    other = root / POD / "other"
    other.mkdir()
    index.born(ino(other), ino(root / POD))
    assert index.rebuilds == 1


def test_a_birth_reported_before_its_directory_shows_is_looked_for_again(root: Path) -> None:
    """The kernel reports a cgroup just before kernfs shows it in the parent's directory."""
    (root / POD).mkdir(parents=True)
    index = CgroupIndex(str(root))
    parent = ino(root / POD)
    index.path(parent)
    child = root / CONTAINER
    child.mkdir()
    cid = ino(child)
    child.rename(root / "hidden")  # not under its parent when the birth is read
    index.born(cid, parent)
    (root / "hidden").rename(child)
    walks = index.rebuilds
    assert index.path(cid) == CONTAINER
    assert index.rebuilds == walks


def test_an_unknown_parent_leaves_the_cgroup_to_the_walk(root: Path) -> None:
    (root / CONTAINER).mkdir(parents=True)
    index = CgroupIndex(str(root))
    index.path(ino(root))
    index.born(ino(root / CONTAINER), 1 << 60)
    assert index.path(ino(root / CONTAINER)) == CONTAINER


def test_births_are_bounded(root: Path, monkeypatch) -> None:
    monkeypatch.setattr("kubenpu.resolve.cgroups._BORN_MAX", 2)
    index = CgroupIndex(str(root))
    index.path(ino(root))
    ids = []
    for name in "abc":
        (root / name).mkdir()
        ids.append(ino(root / name))
        index.born(ids[-1], ino(root))
        vanish(root, root / name)
    assert [index.path(i) for i in ids] == [None, "b", "c"]


def test_resolver_attributes_a_removed_pod_cgroup_it_saw_born(root: Path) -> None:
    """Without the birth the removed cgroup would be not_indexed; with it, the path is known
    (a pod-level cgroup: container_not_found, no CRI call needed)."""
    pod = root / POD
    pod.parent.mkdir(parents=True)
    resolver = Resolver(cgroup_root=str(root), cri_endpoint="unix:///nonexistent")
    resolver.resolve(ino(pod.parent))  # the tree is walked before the pod exists
    pod.mkdir()
    born_id = ino(pod)
    resolver.cgroup_born(born_id, ino(pod.parent))
    vanish(root, pod)
    assert resolver.resolve(born_id).reason == CONTAINER_NOT_FOUND
    resolver.close()
    unaware = Resolver(cgroup_root=str(root), cri_endpoint="unix:///nonexistent")
    assert unaware.resolve(born_id).reason == NOT_INDEXED
    unaware.close()


def test_route_tells_births_from_calls_by_size() -> None:
    calls: list[bytes] = []
    births: list[Birth] = []
    on_record = route(calls.append, births.append)
    call = bytes(40)
    on_record(call)
    on_record(struct.pack("<QQ", 7, 3))
    assert calls == [call]
    assert births == [Birth(cgroup_id=7, parent_id=3)]
