import logging
import os
import subprocess
from pathlib import Path

import pytest

from kubenpu.resolve.cgroups import CgroupIndex

CONTAINER = "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podx.slice/cri-c.scope"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "cgroup"
    (root / CONTAINER).mkdir(parents=True)
    (root / "system.slice" / "containerd.service").mkdir(parents=True)
    (root / "cgroup.procs").write_text("")  # files are not cgroups
    return root


def ino(path: Path) -> int:
    return os.stat(path).st_ino


def missing_id(tmp_path: Path, name: str) -> int:
    """A real inode number that is not in the tree."""
    outside = tmp_path / name
    outside.mkdir()
    return ino(outside)


def test_ids_map_to_relative_paths(root: Path) -> None:
    index = CgroupIndex(str(root))
    assert index.path(ino(root / CONTAINER)) == CONTAINER
    assert index.path(ino(root / "system.slice")) == "system.slice"
    assert index.path(ino(root)) == ""
    assert index.path(ino(root / "cgroup.procs")) is None


def test_rebuilds_only_on_a_miss(root: Path) -> None:
    calls = []
    index = CgroupIndex(str(root), on_rebuild=lambda: calls.append(1))
    index.path(ino(root / CONTAINER))
    index.path(ino(root / "system.slice"))
    assert index.rebuilds == 1

    new = root / "kubepods.slice" / "new.scope"
    new.mkdir()
    assert index.path(ino(new)) == "kubepods.slice/new.scope"
    assert index.rebuilds == 2
    assert len(calls) == 2


def test_repeated_misses_do_not_walk_again(root: Path, tmp_path: Path) -> None:
    index = CgroupIndex(str(root))
    gone, other = missing_id(tmp_path, "gone"), missing_id(tmp_path, "other")
    for _ in range(5):
        assert index.path(gone) is None
    assert index.rebuilds == 1
    assert index.path(other) is None
    assert index.rebuilds == 2
    assert index.path(other) is None
    assert index.rebuilds == 2


def test_symlinks_are_not_followed(root: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (target / "inner").mkdir(parents=True)
    (root / "system.slice" / "link").symlink_to(target)
    index = CgroupIndex(str(root))
    assert index.path(ino(target)) is None
    assert index.path(ino(target / "inner")) is None


def test_alive_and_forget(root: Path) -> None:
    index = CgroupIndex(str(root))
    cid = ino(root / CONTAINER)
    assert index.path(cid) == CONTAINER
    assert index.alive(cid)

    (root / CONTAINER).rmdir()
    assert not index.alive(cid)
    (root / CONTAINER).mkdir()  # same path, new cgroup
    assert not index.alive(cid) or ino(root / CONTAINER) == cid

    index.forget(cid)
    assert not index.alive(cid)
    rebuilds = index.rebuilds
    assert index.path(cid) is None or ino(root / CONTAINER) == cid
    assert index.rebuilds == rebuilds + 1


def test_alive_never_walks(root: Path) -> None:
    index = CgroupIndex(str(root))
    assert not index.alive(ino(root / CONTAINER))
    assert index.rebuilds == 0


def test_missing_root_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    index = CgroupIndex(str(tmp_path / "absent"))
    with caplog.at_level(logging.WARNING):
        assert index.path(12345) is None
        assert index.path(67890) is None
    assert index.rebuilds == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"cgroup root {tmp_path / 'absent'} unreadable (No such file or directory): "
        "no pod attribution"
    ]


def test_other_file_systems_are_skipped(root: Path) -> None:
    """cgroup v1 and hybrid hosts mount other hierarchies below the root; their inode numbers
    collide with ours, so the walk must not enter them."""
    mnt = root / "cpu"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "kubenpu-test", str(mnt)], check=False)
    if mounted.returncode != 0:
        pytest.skip("needs mount (root)")
    try:
        (mnt / "x").mkdir()
        index = CgroupIndex(str(root))
        assert index.path(ino(mnt / "x")) != "cpu/x"
        assert index.path(ino(mnt)) != "cpu"
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
