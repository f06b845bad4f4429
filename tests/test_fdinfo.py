"""The DRM fdinfo reader and `kubenpuctl clients`, on fixture /proc trees and on the real /proc.

The fixture trees (tests/testdata/proc/<machine>, README in each) copy each driver's fdinfo as
the kernel source prints it; sys/ and dev/ link to the sysfs fixture machines.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cri_server import CriTestServer

from kubenpu.cli.ctl import main
from kubenpu.discovery import discover
from kubenpu.sources import fdinfo as fdinfo_module
from kubenpu.sources.fdinfo import (
    _MAX_FDINFO,
    _MAX_NAME,
    Client,
    FdinfoReader,
    HighWater,
    Scan,
    Skip,
    parse,
)

TESTDATA = Path(__file__).parent / "testdata"
PROC = TESTDATA / "proc"
NOBODY = 65534


def uid(n: int) -> str:
    return f"1c0ffee0-aaaa-4bbb-8ccc-{n:012d}"


def pod(n: int) -> str:
    slice_uid = uid(n).replace("-", "_")
    return (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{slice_uid}.slice/cri-containerd-{f'{n:02d}' * 32}.scope"
    )


def scan(root: Path, pids: list[int] | None = None) -> Scan:
    return FdinfoReader(discover(root), root).scan(pids)


def by_id(result: Scan) -> dict[int, Client]:
    return {c.client_id: c for c in result.clients}


# --- parsing -------------------------------------------------------------------------------


def test_units_scale_to_base_units() -> None:
    info = parse(
        "drm-engine-a:\t5 ns\ndrm-engine-b:\t7\n"
        "drm-maxfreq-a:\t3 Hz\ndrm-maxfreq-b:\t3 KHz\ndrm-maxfreq-c:\t3 MHz\n"
        "drm-total-r:\t2\ndrm-shared-r:\t2 KiB\ndrm-active-r:\t2 MiB\ndrm-purgeable-r:\t2 GiB\n"
    )
    assert info.engines == {
        "a": {"busy_ns": 5, "maxfreq_hz": 3},
        "b": {"busy_ns": 7, "maxfreq_hz": 3_000},
        "c": {"maxfreq_hz": 3_000_000},
    }
    assert info.memory == {
        "r": {"total": 2, "shared": 2048, "active": 2 << 20, "purgeable": 2 << 30}
    }
    assert info.skipped == {}


@pytest.mark.parametrize(
    "line",
    [
        "drm-engine-render:\t5 KiB",  # a size unit on a time
        "drm-maxfreq-gpu:\t5 ns",
        "drm-total-vram:\t5 Hz",
        "drm-cycles-rcs:\t5 ns",  # cycles have no unit
        "drm-total-vram:\t-5",
        "drm-total-vram:\t5.5 MiB",
        "drm-total-vram:",
        "drm-engine-capacity-vcs:\t0",  # "Zero capacity is not allowed"
        "drm-engine-:\t5 ns",  # no engine name
        "drm-memory-:\t5",
        "drm-client-id:\tabc",
        "drm-pdev:\tsomewhere",
        "drm-driver:",
        "drm-engine-render 5 ns",  # no colon
        # Names become labels: a megabyte of engine or region name is no label.
        "drm-engine-" + "r" * 65 + ":\t5 ns",
        "drm-resident-" + "v" * 65 + ":\t5",
        "drm-driver:\t" + "d" * 65,
        "drm-pdev:\t000000000:03:00.0",  # a domain past 32 bits
    ],
)
def test_a_line_breaking_the_spec_is_counted_and_dropped(line: str) -> None:
    info = parse(f"drm-driver:\ti915\ndrm-client-id:\t1\n{line}\ndrm-engine-copy:\t9 ns\n")
    assert info.skipped == {Skip.MALFORMED: 1}
    assert info.engines == {"copy": {"busy_ns": 9}}
    assert info.memory == {}
    assert info.client_id == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("drm-total-vram:\t18446744073709551615", Skip.OUT_OF_RANGE),  # u64 -1: "unknown"
        ("drm-total-vram:\t9007199254740993 KiB", Skip.OUT_OF_RANGE),  # scales past 2^63
        ("drm-cycles-rcs:\t18446744073709551000", Skip.OUT_OF_RANGE),  # near 2^64
        ("drm-memory-vram:\t9223372036854775808", Skip.OUT_OF_RANGE),  # 2^63
        ("drm-client-id:\t18446744073709551615", Skip.OUT_OF_RANGE),
        ("drm-engine-render:\t" + "9" * 5000 + " ns", Skip.MALFORMED),  # int() would raise
        ("drm-engine-render:\t" + "1" * 21 + " ns", Skip.MALFORMED),  # longer than a u64
    ],
)
def test_a_value_the_wire_cannot_carry_is_counted_and_dropped(line: str, reason: Skip) -> None:
    info = parse(f"drm-driver:\ti915\ndrm-client-id:\t1\n{line}\ndrm-engine-copy:\t9 ns\n")
    assert info.skipped == {reason: 1}
    assert info.engines == {"copy": {"busy_ns": 9}}
    assert info.memory == {}
    assert info.client_id == 1


def test_the_largest_value_the_wire_carries_is_kept() -> None:
    info = parse(f"drm-driver:\ti915\ndrm-client-id:\t1\ndrm-cycles-rcs:\t{2**63 - 1}\n")
    assert (info.engines, info.skipped) == ({"rcs": {"cycles": 2**63 - 1}}, {})


def test_keys_outside_the_spec_are_ignored() -> None:
    info = parse(
        "pos:\t0\nflags:\t02100002\npasid:\t32770\namd-evicted-vram:\t0 KiB\n"
        "drm-curfreq-gpu:\t1 Hz\ndrm-client-name:\tmy renderer\nnot a key value line\n"
    )
    assert (info.engines, info.memory, info.skipped) == ({}, {}, {})


def test_longer_prefixes_win() -> None:
    # "drm-total-cycles-" is an engine key, not memory region "cycles-rcs"; an engine's
    # capacity is no engine named "capacity-vcs"; region names may hold dashes.
    info = parse(
        "drm-total-cycles-rcs:\t10\ndrm-engine-capacity-vcs:\t2\ndrm-total-stolen-system0:\t4\n"
    )
    assert info.engines == {"rcs": {"total_cycles": 10}, "vcs": {"capacity": 2}}
    assert info.memory == {"stolen-system0": {"total": 4}}


@pytest.mark.parametrize(
    "text",
    [
        "drm-memory-cpu:\t1 KiB\ndrm-resident-cpu:\t1536\n",
        "drm-resident-cpu:\t1536\ndrm-memory-cpu:\t1 KiB\n",
    ],
)
def test_resident_wins_over_its_deprecated_alias(text: str) -> None:
    # amdgpu prints both; the alias is truncated to KiB.
    assert parse(text).memory == {"cpu": {"resident": 1536}}


def test_deprecated_memory_key_reads_as_resident() -> None:
    assert parse("drm-memory-vram:\t4 MiB\n").memory == {"vram": {"resident": 4 << 20}}


def test_whitespace_around_values_is_ignored() -> None:
    # amdgpu's legacy keys carry a space before the tab.
    assert parse("drm-memory-gtt: \t2052 KiB\n").memory == {"gtt": {"resident": 2052 << 10}}


# --- fixture trees -------------------------------------------------------------------------


def test_i915_clients_counted_once_with_all_their_pids() -> None:
    result = scan(PROC / "intel-i915")
    assert [(c.client_id, c.pids, c.cgroup) for c in result.clients] == [
        (5, [1200, 1201], pod(1)),  # fd 3, its dup fd 4, and the forked child's fd 3
        (6, [1200], pod(1)),  # card1
        (9, [1300], pod(2)),
        (11, [1500], pod(2)),
    ]
    client = result.clients[0]
    assert (client.device, client.driver) == ("0000:00:02.0", "i915")
    assert client.engines == {
        "render": {"busy_ns": 1851632745},
        "copy": {"busy_ns": 0},
        "video": {"busy_ns": 27543110},
        "video-enhance": {"busy_ns": 0},
    }
    assert client.memory == {
        "system0": {
            "total": 36064 << 10,
            "shared": 0,
            "active": 8 << 20,
            "resident": 36064 << 10,
            "purgeable": 0,
        },
        "stolen-system0": dict.fromkeys(("total", "shared", "active", "resident", "purgeable"), 0),
    }


def test_i915_skips_are_counted_by_reason() -> None:
    result = scan(PROC / "intel-i915")
    assert result.skipped == {
        Skip.VANISHED: 2,  # 1400 lost its fd/, 1401's fd 3 lost its fdinfo
        Skip.MALFORMED: 3,  # 1500's lines
        Skip.NO_CLIENT_ID: 1,  # 1700: a kernel that printed no stats
    }
    assert result.drm_fds == 7
    # 1500's good lines are kept: only the broken ones are gone.
    bad = by_id(result)[11]
    assert bad.engines == {
        "render": {"busy_ns": 5000},
        "video": {"busy_ns": 0},
        "video-enhance": {"busy_ns": 0},
    }
    assert "purgeable" not in bad.memory["system0"]


def test_scan_of_given_pids_reads_only_those() -> None:
    root = PROC / "intel-i915"
    result = scan(root, [1201, 1300])
    assert [(c.client_id, c.pids) for c in result.clients] == [(5, [1201]), (9, [1300])]
    assert (result.skipped, result.drm_fds) == ({}, 2)
    assert scan(root, [99999]).skipped == {Skip.VANISHED: 1}


def test_xe_reports_cycles_and_capacity_only() -> None:
    (client,) = scan(PROC / "intel-arc-xe").clients
    assert (client.device, client.driver, client.client_id, client.pids) == (
        "0000:03:00.0",
        "xe",
        3,
        [2100],
    )
    total = 7655183225
    assert client.engines == {
        "rcs": {"cycles": 28257900, "total_cycles": total},
        "bcs": {"cycles": 0, "total_cycles": total},
        "vcs": {"cycles": 0, "total_cycles": total, "capacity": 2},
        "vecs": {"cycles": 0, "total_cycles": total, "capacity": 2},
        "ccs": {"cycles": 0, "total_cycles": total, "capacity": 4},
    }
    assert client.memory["vram0"] == {
        "total": 23992 << 10,
        "shared": 16 << 20,
        "active": 0,
        "resident": 23992 << 10,
    }
    assert client.memory["system"]["purgeable"] == 0
    assert "purgeable" not in client.memory["gtt"]


def test_amdgpu_and_amdxdna_on_one_machine() -> None:
    result = scan(PROC / "amd-npu")
    assert result.skipped == {}
    gpu, npu = result.clients
    assert (gpu.device, gpu.driver, gpu.client_id, gpu.cgroup) == (
        "0000:c5:00.0",
        "amdgpu",
        1043,
        pod(4),
    )
    assert gpu.engines == {
        "gfx": {"busy_ns": 8817253107},
        "compute": {"busy_ns": 120044},
        "dma": {"busy_ns": 2318455},
    }
    assert gpu.memory["vram"] == {
        "total": 512 << 20,
        "shared": 64 << 20,
        "resident": 512 << 20,
        "purgeable": 0,
    }
    assert gpu.memory["cpu"]["resident"] == 1536  # not the alias' truncated 1 KiB
    assert set(gpu.memory) == {"vram", "gtt", "cpu", "gds", "gws", "oa", "doorbell", "mmioremap"}
    assert (npu.device, npu.driver, npu.client_id, npu.engines) == (
        "0000:c6:00.1",
        "amdxdna_accel_driver",
        17,
        {},
    )
    assert npu.memory == {
        "memory": {"total": 71 << 20, "shared": 0, "resident": 71 << 20, "purgeable": 0}
    }


def test_platform_devices_come_from_the_node() -> None:
    result = scan(PROC / "arm-panfrost")
    assert result.skipped == {}
    display, busy, idle = result.clients
    assert (display.device, display.driver, display.engines, display.memory) == (
        "platform:display-subsystem",
        "rockchip",
        {},
        {},
    )
    assert busy.device == idle.device == "platform:fde60000.gpu"
    assert busy.engines["fragment"] == {
        "busy_ns": 1846584880,
        "cycles": 1424359409,
        "maxfreq_hz": 799999987,
    }
    assert busy.memory["memory"] == {
        "total": 290 << 20,
        "shared": 0,
        "active": 226 << 20,
        "resident": 36496 << 10,
        "purgeable": 128 << 10,
    }
    # Profiling off: only maxfreq; the node was unlinked since the open (" (deleted)").
    assert idle.engines == {
        "fragment": {"maxfreq_hz": 799999987},
        "vertex-tiler": {"maxfreq_hz": 799999987},
    }


def test_msm() -> None:
    (client,) = scan(PROC / "qualcomm-msm").clients
    assert (client.device, client.driver, client.client_id) == (
        "platform:ae01000.display-controller",
        "msm",
        2,
    )
    assert client.engines == {
        "gpu": {"busy_ns": 3270123904, "cycles": 1919640012, "maxfreq_hz": 587000000}
    }
    assert client.memory["memory"]["shared"] == 6152 << 10


# --- faults on copies of the trees -----------------------------------------------------------


@pytest.fixture
def tree_copy() -> Iterator[Callable[[str], Path]]:
    """Writable copies of fixture trees that any user can read (mkdtemp, not pytest's 0700 dir,
    so a child that dropped to nobody can too)."""
    made: list[Path] = []

    def copy(machine: str) -> Path:
        root = Path(tempfile.mkdtemp(prefix="kubenpu-fdinfo-"))
        made.append(root)
        root.chmod(0o755)
        shutil.copytree(PROC / machine / "proc", root / "proc", symlinks=True)
        (root / "sys").symlink_to(TESTDATA / machine / "sys")
        return root

    yield copy
    for root in made:
        shutil.rmtree(root)


@pytest.fixture
def i915_copy(tree_copy: Callable[[str], Path]) -> Path:
    return tree_copy("intel-i915")


def scan_unprivileged(root: Path) -> tuple[dict[str, int], list[int]]:
    """Skips and client ids of a scan without DAC override. As root, chmod 000 stops nothing,
    so the scan runs in a forked child that dropped to nobody first."""

    def summary() -> tuple[dict[str, int], list[int]]:
        result = scan(root)
        return {str(k): v for k, v in result.skipped.items()}, [c.client_id for c in result.clients]

    if os.geteuid() != 0:
        return summary()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, json.dumps(summary()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        data = f.read()
    os.waitpid(child, 0)
    skipped, ids = json.loads(data)
    return skipped, ids


def test_unreadable_fdinfo_is_counted(i915_copy: Path) -> None:
    (i915_copy / "proc/1300/fdinfo/3").chmod(0)
    skipped, ids = scan_unprivileged(i915_copy)
    assert skipped["unreadable"] == 1
    assert ids == [5, 6, 11]


def test_unlistable_fd_dir_is_counted_once(i915_copy: Path) -> None:
    # What ptrace-read denial looks like: the process's fd/ cannot be listed.
    (i915_copy / "proc/1200/fd").chmod(0)
    skipped, ids = scan_unprivileged(i915_copy)
    assert skipped["unreadable"] == 1
    assert ids == [5, 9, 11]  # client 5 is still seen through 1201


def test_fdinfo_that_is_a_directory_is_unreadable(i915_copy: Path) -> None:
    # A read error root meets too (EISDIR): counted like EACCES, never raised.
    info = i915_copy / "proc/1300/fdinfo/3"
    info.unlink()
    info.mkdir()
    result = scan(i915_copy)
    assert result.skipped[Skip.UNREADABLE] == 1
    assert 9 not in by_id(result)


def test_non_utf8_fdinfo_does_not_crash(i915_copy: Path) -> None:
    info = i915_copy / "proc/1300/fdinfo/3"
    info.write_bytes(info.read_bytes() + b"drm-engine-\xff\xfe:\t1 ns\n")
    result = scan(i915_copy)
    assert by_id(result)[9].engines["render"] == {"busy_ns": 95120442}


def test_client_on_an_unknown_node_without_pdev_is_counted(i915_copy: Path) -> None:
    info = i915_copy / "proc/1300/fdinfo/3"
    info.write_text(info.read_text().replace("drm-pdev:\t0000:00:02.0\n", ""))
    fd = i915_copy / "proc/1300/fd/3"
    fd.unlink()
    fd.symlink_to("/dev/dri/renderD200")
    result = scan(i915_copy)
    assert result.skipped[Skip.UNKNOWN_DEVICE] == 1
    assert 9 not in by_id(result)


def test_node_without_pdev_names_the_device(i915_copy: Path) -> None:
    info = i915_copy / "proc/1300/fdinfo/3"
    info.write_text(info.read_text().replace("drm-pdev:\t0000:00:02.0\n", ""))
    assert by_id(scan(i915_copy))[9].device == "0000:00:02.0"


def test_accel_node_without_pdev_names_the_device(tree_copy: Callable[[str], Path]) -> None:
    root = tree_copy("amd-npu")
    info = root / "proc/3200/fdinfo/3"
    info.write_text(info.read_text().replace("drm-pdev:\t0000:c6:00.1\n", ""))
    assert by_id(scan(root))[17].device == "0000:c6:00.1"


def test_device_number_wins_over_node_name(i915_copy: Path) -> None:
    # A container may see the host's renderD129 as its renderD128: where the tree has a real
    # character device, its dev_t names the device, not the path.
    machine = i915_copy / "machine"
    shutil.copytree(TESTDATA / "hybrid-two-gpu", machine, symlinks=True)
    (i915_copy / "sys").unlink()
    (i915_copy / "sys").symlink_to(machine / "sys")
    node = i915_copy / "dev/dri/renderD128"
    node.parent.mkdir(parents=True)
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(226, 129))  # the i915's render node
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    info = i915_copy / "proc/1300/fdinfo/3"
    info.write_text(info.read_text().replace("drm-pdev:\t0000:00:02.0\n", ""))
    # By name, renderD128 is the amdgpu at 0000:03:00.0 on this machine.
    assert by_id(scan(i915_copy))[9].device == "0000:00:02.0"


CUT = b"drm-resident-cut:\t5 KiB\n"


# The cut line starts 4 bytes before the cap, or ends on the first byte after it.
@pytest.mark.parametrize("before", [4, len(CUT) - 1])
def test_an_fdinfo_over_the_read_cap_keeps_its_whole_lines_and_counts_the_cut(
    i915_copy: Path, before: int
) -> None:
    info = i915_copy / "proc/1300/fdinfo/3"
    head = info.read_bytes()
    kept, cut = b"drm-resident-kept:\t3 KiB\n", CUT
    pad = _MAX_FDINFO - before - len(head) - len(kept) - len(b"pad:\t\n")
    info.write_bytes(head + b"pad:\t" + b"x" * pad + b"\n" + kept + cut + b"drm-driver:\tlate\n")
    result = scan(i915_copy, [1300])
    client = by_id(result)[9]
    assert client.memory["kept"] == {"resident": 3 * 1024}
    assert "cut" not in client.memory and client.driver == "i915"
    assert result.skipped == {Skip.MALFORMED: 1}


def test_an_fdinfo_of_exactly_the_cap_is_read_whole(i915_copy: Path) -> None:
    info = i915_copy / "proc/1300/fdinfo/3"
    head, last = info.read_bytes(), b"drm-resident-last:\t3 KiB\n"
    pad = _MAX_FDINFO - len(head) - len(last) - len(b"pad:\t\n")
    info.write_bytes(head + b"pad:\t" + b"x" * pad + b"\n" + last)
    assert info.stat().st_size == _MAX_FDINFO
    result = scan(i915_copy, [1300])
    assert by_id(result)[9].memory["last"] == {"resident": 3 * 1024}
    assert result.skipped == {}


@pytest.mark.parametrize("name", ["fdinfo/3", "cgroup"])
def test_a_huge_proc_file_is_read_only_up_to_its_cap(i915_copy: Path, name: str) -> None:
    """A sparse 256 MiB file where a proc file is: the reader's memory stays near its cap."""
    path = i915_copy / "proc/1300" / name
    with path.open("r+b") as f:
        f.truncate(256 * 2**20)
    tracemalloc.start()
    try:
        result = scan(i915_copy)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
    assert 9 in by_id(result)


@pytest.mark.parametrize("length", [1, _MAX_NAME])
def test_driver_and_engine_names_up_to_the_longest_are_kept(length: int) -> None:
    name = "e" * length
    info = parse(f"drm-driver:\t{name}\ndrm-engine-{name}:\t7 ns\n")
    assert (info.driver, info.engines, info.skipped) == (name, {name: {"busy_ns": 7}}, {})


def test_names_over_the_longest_are_malformed() -> None:
    name = "e" * (_MAX_NAME + 1)
    info = parse(f"drm-driver:\t{name}\ndrm-engine-{name}:\t7 ns\n")
    assert (info.driver, info.engines, info.skipped) == (None, {}, {Skip.MALFORMED: 2})


def test_a_malformed_repeat_of_driver_or_pdev_keeps_the_good_value() -> None:
    info = parse("drm-driver:\txe\ndrm-pdev:\t0000:03:00.0\ndrm-driver:\t\ndrm-pdev:\tbogus\n")
    assert (info.driver, info.pdev, info.skipped) == ("xe", "0000:03:00.0", {Skip.MALFORMED: 2})


def test_a_client_id_without_a_driver_is_no_client(i915_copy: Path) -> None:
    info = i915_copy / "proc/1300/fdinfo/3"
    info.write_text(info.read_text().replace("drm-driver:\ti915\n", ""))
    result = scan(i915_copy, [1300])
    assert result.skipped == {Skip.NO_CLIENT_ID: 1}
    assert 9 not in by_id(result)


def test_an_fd_that_is_no_link_makes_its_process_unreadable_at_once(i915_copy: Path) -> None:
    # readlink fails alike on every fd of a process it denies: one count, the rest not tried.
    for fd in ("0", "1"):
        (i915_copy / "proc/1300/fd" / fd).unlink()
        (i915_copy / "proc/1300/fd" / fd).write_text("")  # EINVAL, as a denied readlink fails
    result = scan(i915_copy, [1300])
    assert (result.skipped, result.unreadable) == ({Skip.UNREADABLE: 1}, {1300})


def test_a_vanished_fd_is_skipped_alone(i915_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, fds = FdinfoReader(discover(i915_copy), i915_copy), i915_copy / "proc/1300/fd"
    readlink, asked = os.readlink, []

    def first_vanished(path: str) -> str:  # that fd was closed after the listing
        if Path(path).parent == fds:
            asked.append(path)
            if len(asked) == 1:
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return readlink(path)

    monkeypatch.setattr(os, "readlink", first_vanished)
    result = reader.scan([1300])
    assert len(asked) == len(os.listdir(fds))  # the fds after it are still read
    assert result.skipped == {Skip.VANISHED: 1}


def test_a_failed_fdinfo_read_marks_its_process_unreadable(i915_copy: Path) -> None:
    info = i915_copy / "proc/1300/fdinfo/3"
    info.unlink()
    info.mkdir()
    assert scan(i915_copy).unreadable == {1300}


@pytest.mark.parametrize("number", [errno.EMFILE, errno.ENFILE])  # the process's, the system's
def test_a_cgroup_read_out_of_descriptors_leaves_that_client_for_the_next_read(
    i915_copy: Path, monkeypatch: pytest.MonkeyPatch, number: int
) -> None:
    """Raised by the read itself (ENFILE too: a flood of the whole node), the pid's cgroup is
    unknown, not none: that client waits for the next read, counted as no_descriptors."""
    reader = FdinfoReader(discover(i915_copy), i915_copy)
    before = reader.scan().skipped
    read = fdinfo_module.read_regular

    def exhausted_for_1300(path: Path, limit: int) -> bytes:
        if path == i915_copy / "proc/1300/cgroup":
            raise OSError(number, os.strerror(number))
        return read(path, limit)

    monkeypatch.setattr(fdinfo_module, "read_regular", exhausted_for_1300)
    result = reader.scan()
    assert [c.client_id for c in result.clients] == [5, 6, 11]  # 9 is 1300's
    assert result.skipped - before == {Skip.NO_DESCRIPTORS: 1}
    assert 1300 in result.unreadable


def test_a_process_without_a_cgroup_file_has_none(i915_copy: Path) -> None:
    (i915_copy / "proc/1300/cgroup").unlink()
    assert by_id(scan(i915_copy))[9].cgroup is None


# --- the real /proc ------------------------------------------------------------------------


def test_live_proc_scan_of_another_process() -> None:
    # Real magic links (a pipe, a file), no DRM node: nothing found, nothing raised. (Not this
    # process: the scan's own directory fd would vanish under it.)
    code = "import sys; f = open(sys.executable, 'rb'); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE)
    try:
        result = FdinfoReader([], "/").scan([child.pid])
    finally:
        child.communicate(b"")
    assert (result.clients, result.skipped, result.drm_fds) == ([], {}, 0)


def test_the_reader_reads_the_live_proc_by_default() -> None:
    pid = os.getpid()
    assert FdinfoReader([]).cgroup(pid) == FdinfoReader([], "/").cgroup(pid) is not None


def test_live_process_that_exited_is_vanished() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: its /proc entry is gone
    assert FdinfoReader([], "/").scan([child.pid]).skipped == {Skip.VANISHED: 1}


def test_full_live_scan_skips_the_reader_itself() -> None:
    # Scanning itself, the reader sees the fd of its own fd/ listing vanish...
    assert FdinfoReader([], "/").scan([os.getpid()]).skipped == {Skip.VANISHED: 1}
    # ...so a full scan leaves it out. In a PID namespace of its own the reader is the only
    # process: nothing may be skipped.
    code = (
        "from kubenpu.sources.fdinfo import FdinfoReader; "
        "print(dict(FdinfoReader([], '/').scan().skipped))"
    )
    unshare = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code]
    result = subprocess.run(unshare, capture_output=True, text=True, timeout=60)
    if result.returncode != 0 and "unshare" in result.stderr:
        pytest.skip(f"no PID namespace here: {result.stderr.strip()}")
    assert (result.returncode, result.stdout) == (0, "{}\n"), result.stderr


# --- HighWater -----------------------------------------------------------------------------


def test_high_water_stays_at_the_larger_value_until_overtaken() -> None:
    busy: HighWater[tuple[str, int, str]] = HighWater()
    key = ("0000:00:02.0", 5, "render")
    assert [busy.update(key, v) for v in (100, 90, 95, 100, 130)] == [100, 100, 100, 100, 130]
    other = ("0000:00:02.0", 6, "render")
    assert busy.update(other, 7) == 7  # per key
    assert (busy.get(key), busy.get(("0000:00:02.0", 7, "render"))) == (130, 0)


# --- kubenpuctl clients --------------------------------------------------------------------


def run_ctl(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["clients", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_ctl_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_ctl(capsys, "--root", str(PROC / "arm-panfrost"))
    assert (code, err) == (0, "")
    assert [line.split(maxsplit=7) for line in out.splitlines()] == [
        ["DEVICE", "DRIVER", "CLIENT", "PIDS", "POD", "BUSY", "MEMORY", "CGROUP"],
        [
            "platform:display-subsystem",
            "rockchip",
            "2",
            "4300",
            "-",
            "-",
            "-",
            "/system.slice/weston.service",
        ],
        [
            "platform:fde60000.gpu",
            "panfrost",
            "14",
            "4100",
            f"uid:{uid(6)}",
            "fragment=1.847s,vertex-tiler=0.072s",
            "memory=35.6MiB",
            pod(6),
        ],
        [
            "platform:fde60000.gpu",
            "panfrost",
            "15",
            "4200",
            f"uid:{uid(7)}",
            "-",
            "memory=4.0MiB",
            pod(7),
        ],
    ]


def test_ctl_table_shows_the_busy_share_of_cycles_where_there_is_no_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """xe's busy cycles were shown as raw pairs (rcs=28257900/7655183225cy,...: 330-character
    rows); the fixture's rcs is 28,257,900 of 7,655,183,225 cycles: 0.37 %."""
    _, out, _ = run_ctl(capsys, "--root", str(PROC / "intel-arc-xe"))
    row = out.splitlines()[1].split()
    assert row[5] == "rcs=0.4%,bcs=0.0%,vcs=0.0%,vecs=0.0%,ccs=0.0%"
    assert row[6] == "gtt=192KiB,vram0=23.4MiB"


def test_ctl_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_ctl(capsys, "--root", str(PROC / "qualcomm-msm"), "-o", "json")
    assert code == 0
    assert json.loads(out) == [
        {
            "device": "platform:ae01000.display-controller",
            "driver": "msm",
            "client_id": 2,
            "pids": [5100],
            "namespace": None,
            "pod": None,
            "container": None,
            "pod_uid": uid(8),
            "container_id": "08" * 32,
            "cgroup": pod(8),
            "engines": {
                "gpu": {"busy_ns": 3270123904, "cycles": 1919640012, "maxfreq_hz": 587000000}
            },
            "memory": {
                "memory": {
                    "total_bytes": 22688 << 10,
                    "shared_bytes": 6152 << 10,
                    "active_bytes": 1032 << 10,
                    "resident_bytes": 22688 << 10,
                    "purgeable_bytes": 0,
                }
            },
        }
    ]


def test_ctl_json_keys_follow_what_the_driver_printed(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_ctl(capsys, "--root", str(PROC / "intel-i915"), "-o", "json")
    clients = json.loads(out)
    assert [(c["client_id"], c["pids"]) for c in clients] == [
        (5, [1200, 1201]),
        (6, [1200]),
        (9, [1300]),
        (11, [1500]),
    ]
    assert all("capacity" not in e for c in clients for e in c["engines"].values())


def test_ctl_warns_about_skips_on_one_line() -> None:
    kubenpuctl = Path(sys.executable).parent / "kubenpuctl"
    result = subprocess.run(
        [str(kubenpuctl), "clients", "--root", str(PROC / "intel-i915")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert result.stderr == (
        "kubenpuctl: warning: skipped (see docs/fdinfo.md): "
        "malformed 3, no_client_id 1, vanished 2\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--root", "/nonexistent"], "/nonexistent: no proc directory"),
        (["--output", "yaml"], "invalid choice: 'yaml'"),
    ],
)
def test_ctl_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = run_ctl(capsys, *args)
    assert (code, out) == (2, "")
    (line,) = err.splitlines()
    assert line.startswith("kubenpuctl: error: ") and message in line


def test_ctl_reads_the_live_system(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_ctl(capsys, "-o", "json")
    assert code == 0
    # The clients the library's own scan of / finds: their counters move between the two
    # reads, which client each row is does not.
    live = FdinfoReader(discover(Path("/")), Path("/")).scan().clients
    shown = {(row["device"], row["client_id"], tuple(row["pids"])) for row in json.loads(out)}
    assert shown == {(c.device, c.client_id, tuple(c.pids)) for c in live}


def test_ctl_names_pods_through_the_cri(
    capsys: pytest.CaptureFixture[str], cri: CriTestServer, cri_socket: str
) -> None:
    """`clients` had no pod column, only the cgroup path: the pod is named by the runtime."""
    cri.add_container("06" * 32, "ml", "trainer-0", "main")
    cri.add_container("07" * 32, "ml", "trainer-1", "main")
    root = str(PROC / "arm-panfrost")
    code, out, err = run_ctl(capsys, "--root", root, "--cri", f"unix://{cri_socket}")
    assert (code, err) == (0, "")
    assert [line.split()[4] for line in out.splitlines()] == [
        "POD",
        "-",
        "ml/trainer-0/main",
        "ml/trainer-1/main",
    ]
    _, out, _ = run_ctl(capsys, "--root", root, "--cri", cri_socket, "-o", "json")
    (_, first, second) = json.loads(out)
    assert (first["namespace"], first["pod"], first["container"]) == ("ml", "trainer-0", "main")
    assert (second["pod_uid"], second["container_id"]) == (uid(7), "07" * 32)
    # It quiets the CRI client's retry warning while it asks, and only then: a level left at
    # ERROR silenced every later CRI warning in the process (test_cri's, in one CI worker).
    assert logging.getLogger("kubenpu.resolve.cri").level == logging.NOTSET


def test_ctl_without_the_cri_names_pods_by_their_uid(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    sock = tmp_path / "none.sock"
    code, out, _ = run_ctl(capsys, "--root", str(PROC / "arm-panfrost"), "--cri", str(sock))
    assert code == 0
    assert [line.split()[4] for line in out.splitlines()[2:]] == [f"uid:{uid(6)}", f"uid:{uid(7)}"]
    assert caplog.messages == [f"pods are named by their cgroup's pod uid: no CRI socket at {sock}"]


@pytest.mark.parametrize("fifo", ["proc/1300/fdinfo/3", "proc/1300/cgroup"])
def test_ctl_never_blocks_on_a_fifo(i915_copy: Path, fifo: str) -> None:
    """A FIFO in the tree hung `clients` for good: it was opened for reading, blocking."""
    (i915_copy / fifo).unlink()
    os.mkfifo(i915_copy / fifo)
    kubenpuctl = Path(sys.executable).parent / "kubenpuctl"
    try:
        result = subprocess.run(
            [str(kubenpuctl), "clients", "--root", str(i915_copy), "-o", "json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("kubenpuctl clients blocked on a FIFO")
    assert result.returncode == 0
    clients = {c["client_id"]: c for c in json.loads(result.stdout)}
    assert {5, 6, 11} <= clients.keys()


def test_ctl_escapes_control_characters(
    capsys: pytest.CaptureFixture[str], i915_copy: Path
) -> None:
    """A cgroup path with an escape sequence reached the terminal raw."""
    (i915_copy / "proc/1300/cgroup").write_text("0::/system.slice/x\x1b[2J\u202ey.service\n")
    code, out, _ = run_ctl(capsys, "--root", str(i915_copy))
    assert code == 0
    assert "\x1b" not in out and "\u202e" not in out
    assert "/system.slice/x\\x1b[2J\\u202ey.service" in out
    _, out, _ = run_ctl(capsys, "--root", str(i915_copy), "-o", "json")
    assert "\x1b" not in out and "\u202e" not in out  # JSON escapes them itself
    assert "/system.slice/x\x1b[2J\u202ey.service" in {c["cgroup"] for c in json.loads(out)}
