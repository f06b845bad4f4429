import logging
import os
import subprocess
import threading
from pathlib import Path

import pytest
from fakes import Clock
from helpers import out_of_descriptors

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


def mkdir_with_a_new_inode(path: Path, old: int, spares: Path) -> None:
    """Makes path again as a new cgroup would be: with another inode than `old` (a file system
    may hand out a freed inode at once; such a directory is moved to `spares`, out of the tree)."""
    spares.mkdir(exist_ok=True)
    path.mkdir()
    while ino(path) == old:
        path.rename(spares / str(len(list(spares.iterdir()))))
        path.mkdir()


def test_alive_and_forget(root: Path, tmp_path: Path) -> None:
    index = CgroupIndex(str(root))
    cid = ino(root / CONTAINER)
    assert index.path(cid) == CONTAINER
    assert index.alive(cid)

    (root / CONTAINER).rmdir()
    assert not index.alive(cid)
    mkdir_with_a_new_inode(root / CONTAINER, cid, tmp_path / "spares")  # same path, new cgroup
    assert not index.alive(cid)

    index.forget(cid)
    assert not index.alive(cid)
    rebuilds = index.rebuilds
    assert index.path(cid) is None
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


def born(index: CgroupIndex, root: Path, rel: str) -> int:
    """mkdir as the runtime does, and report it as the kernel would."""
    (root / rel).mkdir()
    cgroup_id = ino(root / rel)
    index.cgroups_born([(cgroup_id, ino((root / rel).parent))])
    return cgroup_id


def test_born_cgroup_is_indexed_from_its_parent_without_a_walk(root: Path, tmp_path: Path) -> None:
    index = CgroupIndex(str(root))
    assert index.path(ino(root)) == ""
    new = born(index, root, f"{CONTAINER}/sub")
    (root / CONTAINER / "sub").rename(tmp_path / "gone")  # removed at once (keeps its inode)
    assert index.path(new) == f"{CONTAINER}/sub"
    assert not index.alive(new)
    assert index.rebuilds == 1


def test_born_under_an_unknown_parent_walks_once(root: Path, tmp_path: Path) -> None:
    index = CgroupIndex(str(root))
    new = born(index, root, "system.slice/new.service")  # nothing indexed yet
    assert index.rebuilds == 1
    assert index.path(new) == "system.slice/new.service"
    assert index.path(ino(root / CONTAINER)) == CONTAINER
    # A parent outside the root: one walk, then remembered as missing.
    outside = tmp_path / "elsewhere"
    for name in ("a", "b"):
        (outside / name).mkdir(parents=True)
        index.cgroups_born([(ino(outside / name), ino(outside))])
    assert index.rebuilds == 2
    assert index.path(ino(outside / "a")) is None
    assert index.rebuilds == 3  # a miss of its own


def test_born_cgroup_not_visible_yet_is_looked_for_again(root: Path, tmp_path: Path) -> None:
    # cgroup_mkdir fires before kernfs_activate(): the birth may come before the directory shows.
    index = CgroupIndex(str(root))
    index.path(ino(root))
    (tmp_path / "hidden").mkdir()
    new = ino(tmp_path / "hidden")
    index.cgroups_born([(new, ino(root / "system.slice"))])  # not in its parent's directory yet
    (tmp_path / "hidden").rename(root / "system.slice" / "late.scope")  # now visible
    born(index, root, "system.slice/next.scope")  # the next birth looks again
    (root / "system.slice" / "late.scope").rename(tmp_path / "gone")  # removed at once
    assert index.path(new) == "system.slice/late.scope"


def test_born_cgroup_that_is_gone_survives_a_walk(root: Path, tmp_path: Path) -> None:
    index = CgroupIndex(str(root))
    index.path(ino(root))
    new = born(index, root, "system.slice/short.scope")
    (root / "system.slice" / "short.scope").rename(tmp_path / "gone")
    assert index.path(missing_id(tmp_path, "other")) is None  # walks
    assert index.rebuilds == 2
    assert index.path(new) == "system.slice/short.scope"


def test_gone_born_cgroups_nobody_asked_about_are_pruned(root: Path, tmp_path: Path) -> None:
    """Most new cgroups never call a GPU driver: the index must not keep them all."""
    clock = Clock(0.0)
    index = CgroupIndex(str(root), clock=clock)
    index.path(ino(root))
    away = tmp_path / "away"
    away.mkdir()
    ids = [born(index, root, f"system.slice/s{i}") for i in range(1023)]  # one short of 1,024
    asked, kept = ids[0], ids[1]
    assert index.path(asked) == "system.slice/s0"
    for i in range(1023):
        if i != 1:
            (root / "system.slice" / f"s{i}").rename(away / f"s{i}")
    clock.now += 301
    born(index, root, "system.slice/new1")
    born(index, root, "system.slice/new2")  # 1,024 not asked about: prunes
    walks = index.rebuilds
    assert index.path(asked) == "system.slice/s0"  # asked for: kept until forget()
    assert index.path(kept) == "system.slice/s1"  # still there
    assert index.rebuilds == walks
    assert index.path(ids[2]) is None  # pruned: a miss walks, and finds nothing
    assert index.rebuilds == walks + 1


def test_births_on_another_thread_while_walking(root: Path, tmp_path: Path) -> None:
    index = CgroupIndex(str(root))
    index.path(ino(root))
    away = tmp_path / "away"
    away.mkdir()
    (root / "kubepods.slice" / "churn").mkdir()
    ids: dict[int, str] = {}

    def churn() -> None:
        for i in range(300):
            rel = f"kubepods.slice/churn/c{i}"
            ids[born(index, root, rel)] = rel
            (root / rel).rename(away / f"c{i}")

    thread = threading.Thread(target=churn)
    thread.start()
    misses = 0
    while thread.is_alive():
        misses += 1
        assert index.path(missing_id(tmp_path, f"m{misses}")) is None  # a walk each
    thread.join()
    assert {cgroup_id: index.path(cgroup_id) for cgroup_id in ids} == ids


def test_a_walk_out_of_descriptors_is_counted_logged_and_retried(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A limit of 1,024 and 1,100 idle connections: a new pod's walk failed with EMFILE, no log
    line, and its cgroup was taken as missing for good (7 of 7 calls not_indexed)."""
    counted: list[tuple[str, int]] = []
    index = CgroupIndex(str(root), on_exhausted=lambda where, n: counted.append((where, n)))
    known = ino(root / CONTAINER)
    assert index.path(known) == CONTAINER
    new = root / "kubepods.slice" / "new.scope"
    new.mkdir()
    with caplog.at_level(logging.WARNING), out_of_descriptors():
        index.index([ino(new)])
        index.index([ino(new)])
    assert counted and {where for where, _ in counted} == {"cgroup_walk"}
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "out of file descriptors" in caplog.records[0].message
    walks = index.rebuilds
    assert index.path(known) == CONTAINER  # what the partial walk could not open is kept:
    assert index.rebuilds == walks  # no walk needed to find it again
    index.index([ino(new)])  # descriptors back: the next batch walks again and finds it
    assert index.path(ino(new)) == "kubepods.slice/new.scope"


def test_a_removal_is_looked_for_when_the_tree_counters_move_a_birth_comes_or_a_minute_passed(
    root: Path,
) -> None:
    stat, clock = root / "cgroup.stat", Clock()
    index = CgroupIndex(str(root), clock=clock)
    assert index.removed()  # no cgroup.stat (not a cgroup v2 root): every time
    assert index.removed()
    stat.write_text("nr_descendants 3\nnr_dying_descendants 0\n")
    assert index.removed() and not index.removed()
    stat.write_text("nr_descendants 2\nnr_dying_descendants 1\n")  # a rmdir
    assert index.removed() and not index.removed()
    stat.write_text("nr_descendants 2\nnr_dying_descendants 0\n")  # freed
    assert index.removed() and not index.removed()
    index.cgroups_born([(ino(root / "kubepods.slice"), ino(root))])  # a birth; counters as before
    assert index.removed() and not index.removed()
    clock.now += 60
    assert index.removed() and not index.removed()
    stat.write_text("nr_descendants two\nnr_dying_descendants 0\n")
    assert index.removed() and index.removed()  # unreadable counters: every time


def test_the_minutes_sweep_comes_while_the_reap_checks_every_5_seconds(root: Path) -> None:
    """Checks that find nothing do not put the sweep off: with the reap's check every 5 s and
    a still tree, the one a minute after the last sweep is True, and the 11 before it are not."""
    stat, clock = root / "cgroup.stat", Clock()
    stat.write_text("nr_descendants 3\nnr_dying_descendants 0\n")
    index = CgroupIndex(str(root), clock=clock)
    assert index.removed()  # the first look: the counters are new
    found = []
    for _ in range(12):
        clock.now += 5
        found.append(index.removed())
    assert found == [False] * 11 + [True]
