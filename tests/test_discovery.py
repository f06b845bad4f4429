"""Discovery against the sysfs fixture machines in tests/testdata (built by generate.py)."""

from __future__ import annotations

import filecmp
import importlib.util
import logging
import os
from pathlib import Path

import pytest

from kubenpu.discovery import Device, Node, discover

TESTDATA = Path(__file__).parent / "testdata"


def _generator():
    spec = importlib.util.spec_from_file_location("fixture_generator", TESTDATA / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drm(card: int, render: int | None = None) -> tuple[Node, ...]:
    """cardN and, if given, renderDM."""
    nodes = [Node(f"/dev/dri/card{card}", f"card{card}", 226, card)]
    if render is not None:
        nodes.append(Node(f"/dev/dri/renderD{render}", f"renderD{render}", 226, render))
    return tuple(nodes)


def accel(minor: int) -> tuple[Node, ...]:
    return (Node(f"/dev/accel/accel{minor}", f"accel{minor}", 261, minor),)


def dev(
    id_: str,
    driver: str | None,
    pci_id: str | None,
    numa: int | None,
    vendor: str | None,
    nodes: tuple[Node, ...],
) -> Device:
    return Device(id_, driver, pci_id, numa, nodes, vendor)


EXPECTED = {
    "intel-i915": [dev("0000:00:02.0", "i915", "8086:5917", None, "i915", drm(1, 128))],
    "intel-arc-xe": [dev("0000:03:00.0", "xe", "8086:e20b", None, "xe", drm(0, 128))],
    "amd-server": [
        # The BMC's display has no render node and no plug-in.
        dev("0000:02:00.0", "ast", "1a03:2000", 0, None, drm(0)),
        dev("0000:c3:00.0", "amdgpu", "1002:744c", 1, "amdgpu", drm(1, 128)),
    ],
    "hybrid-two-gpu": [
        # Node numbers run opposite to address order: grouping must follow the device links.
        dev("0000:00:02.0", "i915", "8086:9a49", None, "i915", drm(1, 129)),
        dev("0000:03:00.0", "amdgpu", "1002:73ff", None, "amdgpu", drm(0, 128)),
    ],
    "mi300-partitions": [
        dev("0000:05:00.0", "amdgpu", "1002:74a1", 0, "amdgpu", drm(1, 128)),
        # A partition has no driver link: its name (amdgpu_xcp_N) selects amdgpu's plug-in.
        dev("platform:amdgpu_xcp_0", None, None, None, "amdgpu", drm(2, 129)),
        dev("platform:amdgpu_xcp_1", None, None, None, "amdgpu", drm(3, 130)),
    ],
    "intel-npu": [
        dev("0000:00:02.0", "i915", "8086:7d55", None, "i915", drm(0, 128)),
        dev("0000:00:0b.0", "intel_vpu", "8086:7d1d", None, "ivpu", accel(0)),
    ],
    "gaudi": [
        dev("0000:33:00.0", "habanalabs", "1da3:1020", 0, "habanalabs", accel(0)),
        dev("0000:b3:00.0", "habanalabs", "1da3:1020", 1, "habanalabs", accel(1)),
    ],
    "qualcomm-ai100": [dev("0000:41:00.0", "qaic", "17cb:a100", 0, "qaic", accel(0))],
    "amd-npu": [
        dev("0000:c5:00.0", "amdgpu", "1002:15bf", None, "amdgpu", drm(0, 128)),
        dev("0000:c6:00.1", "amdxdna", "1022:1502", None, "amdxdna", accel(0)),
    ],
    "arm-panfrost": [
        dev("platform:display-subsystem", "rockchip-drm", None, None, None, drm(0)),
        dev("platform:fde60000.gpu", "panfrost", None, None, "panfrost", drm(1, 128)),
    ],
    "raspberry-pi4": [
        dev("platform:fec00000.v3d", "v3d", None, None, "v3d", drm(0, 128)),
        dev("platform:gpu", "vc4-drm", None, None, "vc4", drm(1)),
    ],
    "virtio-gpu": [dev("0000:00:04.0", "virtio_gpu", "1af4:1050", None, "virtio_gpu", drm(0, 128))],
    "virtio-gpu-old": [
        dev("0000:00:02.0", "virtio_gpu", "1af4:1050", None, "virtio_gpu", drm(0, 128))
    ],
    # No driver is bound, so none is shown; the device name selects the plug-in.
    "vgem-platform": [dev("platform:vgem", None, None, None, "vgem", drm(0, 128))],
    "vgem-faux": [dev("platform:vgem", "faux_driver", None, None, "vgem", drm(0, 128))],
    "nvidia": [dev("0000:01:00.0", "nvidia", "10de:2684", 0, None, drm(0, 128))],
    "broken": [
        dev("0000:00:02.0", None, None, None, None, drm(0, 128)),
        dev("0000:00:0b.0", "intel_vpu", None, 0, "ivpu", accel(0)),
    ],
}


@pytest.mark.parametrize("machine", sorted(EXPECTED))
def test_machine(machine: str) -> None:
    assert discover(TESTDATA / machine) == EXPECTED[machine]


def test_every_fixture_machine_is_checked() -> None:
    assert set(_generator().MACHINES) == set(EXPECTED)


def test_committed_fixtures_match_generator(tmp_path: Path) -> None:
    _generator().generate(tmp_path)
    for machine in EXPECTED:
        _assert_same_tree(tmp_path / machine, TESTDATA / machine)


def _assert_same_tree(want: Path, got: Path) -> None:
    def listing(top: Path) -> dict[str, str | None]:
        entries = {}
        for d, dirs, files in os.walk(top):  # does not follow the links, which loop
            for name in dirs + files:
                path = Path(d, name)
                entries[str(path.relative_to(top))] = (
                    os.readlink(path) if path.is_symlink() else None
                )
        return entries

    assert listing(got) == listing(want), f"{got}: rerun tests/testdata/generate.py"
    files = [p for p, link in listing(want).items() if link is None and (want / p).is_file()]
    _, mismatch, errors = filecmp.cmpfiles(want, got, files, shallow=False)
    assert mismatch == errors == [], f"{got}: rerun tests/testdata/generate.py"


def test_nodes_carry_the_major_minor_sysfs_lists() -> None:
    # kernel/maps.py encodes them as the kernel-internal dev_t (tests/test_events.py)
    (i915,) = discover(TESTDATA / "intel-i915")
    assert [(n.major, n.minor) for n in i915.nodes] == [(226, 1), (226, 128)]


def test_broken_tree_warns_once_per_problem(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kubenpu.discovery")
    discover(TESTDATA / "broken")
    messages = [r.getMessage() for r in caplog.records]
    expected = [
        "card0 has no /dev/dri/card0",
        "card1/dev: unexpected content 'two-two-six'",
        "skipping node card1",
        "card2/dev: unreadable: a directory, not a regular file",
        "skipping node card2",
        "card3/device: cannot resolve",
        "skipping node card3",
        "renderD129/dev: missing",
        "skipping node renderD129",
        "renderD130/device: cannot resolve",
        "skipping node renderD130",
        "0000:00:02.0/driver: not a readable link",
        "0000:00:02.0/vendor: unexpected content '0xzz86'",
        "0000:00:02.0/numa_node: unexpected content 'banana'",
        "0000:00:0b.0/device: unreadable",
    ]
    assert len(messages) == len(expected), messages
    for want, got in zip(expected, messages, strict=True):
        assert want in got


def test_healthy_machines_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kubenpu.discovery")
    for machine in EXPECTED.keys() - {"broken"}:
        discover(TESTDATA / machine)
    assert caplog.records == []


def test_machine_without_gpu_is_empty(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "sys/class").mkdir(parents=True)
    assert discover(tmp_path) == []
    assert caplog.records == []


def test_unlistable_class_dir_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "sys/class").mkdir(parents=True)
    (tmp_path / "sys/class/drm").write_text("not a directory")
    assert discover(tmp_path) == []
    assert "cannot list" in caplog.text


def test_names_and_numbers_in_other_scripts_digits_are_not_nodes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """card\\u0661 matched (card|renderD|accel)\\d+ (a str pattern's \\d is any script's digit) and
    int('\\u0661') (Arabic-Indic one) is 1: a node the kernel cannot have, with another node's
    number."""
    import shutil

    root = tmp_path / "amd-server"
    shutil.copytree(TESTDATA / "amd-server", root, symlinks=True)
    before = discover(root)
    card1 = root / "sys/class/drm/card1"
    (root / "sys/class/drm/card\u0661").symlink_to(os.readlink(card1))
    (root / "dev/dri/card\u0661").touch()
    assert discover(root) == before
    (card1 / "dev").write_text("226:\u0661\n")
    with caplog.at_level(logging.WARNING, logger="kubenpu.discovery"):
        [amd] = [d for d in discover(root) if d.driver == "amdgpu"]
    assert [n.name for n in amd.nodes] == ["renderD128"]
    assert "unexpected content '226:\u0661'" in caplog.text
