"""kubenpuctl, run as the installed console script and in process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kubenpu.cli.ctl import Summary, main
from kubenpu.metrics.catalogue import DEVICE_ERRORS, FREQUENCY, POWER, TEMPERATURE
from kubenpu.sources.sysfs import Reading
from kubenpu.vendors import all_vendors, core

REPO = Path(__file__).resolve().parent.parent
TESTDATA = Path(__file__).parent / "testdata"
# The console script pip installed next to this interpreter (scripts/venv.sh, or pip install .).
KUBENPUCTL = Path(sys.executable).parent / "kubenpuctl"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBENPUCTL), *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def test_devices_table_i915() -> None:
    result = run("devices", "--root", "tests/testdata/intel-i915")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout == (
        "DRIVER  PCI ID     ADDRESS       MAJOR:MINOR    NUMA  VENDOR  POWER  TEMP  FREQ"
        "     HEALTH\n"
        "i915    8086:5917  0000:00:02.0  226:1,226:128  -     i915    -      -     300 MHz  ok\n"
    )


AMD_ROW = ["63", "W", "41", "°C", "1200", "MHz", "ok"]  # POWER, TEMP, FREQ, HEALTH


def test_devices_table_shows_power_temperature_and_clock_from_sysfs() -> None:
    result = run("devices", "--root", "tests/testdata/amd-server")
    assert result.stdout.splitlines()[2].split()[-7:] == AMD_ROW


def test_devices_health_is_degraded_by_uncorrected_errors(tmp_path: Path) -> None:
    shutil.copytree(TESTDATA / "amd-server", tmp_path, symlinks=True, dirs_exist_ok=True)
    ras = next(tmp_path.glob("sys/devices/*/*/0000:c3:00.0/ras"))
    (ras / "gfx_err_count").write_text("ue: 2\nce: 0\n")
    result = run("devices", "--root", str(tmp_path), "-o", "json")
    amd, gpu = json.loads(result.stdout)
    assert (amd["health"], amd["uncorrected_errors"]) == ("ok", None)  # ast: no RAS
    assert (gpu["health"], gpu["uncorrected_errors"]) == ("degraded", 2)


def test_devices_table_marks_missing_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--root", str(TESTDATA / "arm-panfrost")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "DRIVER        PCI ID  ADDRESS                     MAJOR:MINOR    NUMA  VENDOR    POWER"
        "  TEMP  FREQ  HEALTH",
        "rockchip-drm  -       platform:display-subsystem  226:0          -     -         -      -"
        "     -     ok",
        "panfrost      -       platform:fde60000.gpu       226:1,226:128  -     panfrost  -      -"
        "     -     ok",
    ]


def test_devices_on_a_broken_tree_warns_and_lists_the_rest() -> None:
    result = run("devices", "--root", "tests/testdata/broken")
    assert result.returncode == 0
    assert result.stdout.splitlines()[1:] == [
        "-          -       0000:00:02.0  226:0,226:128  -     -       -      -     -     ok",
        "intel_vpu  -       0000:00:0b.0  261:0          0     ivpu    -      -     -     ok",
    ]
    warnings = result.stderr.splitlines()
    assert warnings and all(w.startswith("kubenpuctl: warning: ") for w in warnings)


def test_devices_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--root", str(TESTDATA / "intel-npu"), "--output", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {
            "driver": "i915",
            "pci_id": "8086:7d55",
            "address": "0000:00:02.0",
            "nodes": ["226:0", "226:128"],
            "vendor": "i915",
            "numa_node": None,
            "paths": ["/dev/dri/card0", "/dev/dri/renderD128"],
            "power_watts": None,
            "temperature_celsius": None,
            "frequency_mhz": 300.0,
            "health": "ok",
            "uncorrected_errors": None,
        },
        {
            "driver": "intel_vpu",
            "pci_id": "8086:7d1d",
            "address": "0000:00:0b.0",
            "nodes": ["261:0"],
            "vendor": "ivpu",
            "numa_node": None,
            "paths": ["/dev/accel/accel0"],
            "power_watts": None,
            "temperature_celsius": None,
            "frequency_mhz": 1850.0,
            "health": "ok",
            "uncorrected_errors": None,
        },
    ]


def test_devices_json_numa_node(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--root", str(TESTDATA / "amd-server"), "-o", "json"]) == 0
    assert [d["numa_node"] for d in json.loads(capsys.readouterr().out)] == [0, 1]


def test_the_summary_is_the_first_of_each_kind_and_the_actual_frequency() -> None:
    gpu = {"device": "0000:03:00.0", "vendor": "xe", "sensor": "gpu", "chip": "xe"}
    reading = Reading(
        values=[
            (POWER, {**gpu, "sensor": "package"}, 63.0),
            (POWER, gpu, 10.0),
            (TEMPERATURE, gpu, 45.0),
            (FREQUENCY, {"domain": "gt0", "state": "requested"}, 2.0e9),
            (FREQUENCY, {"domain": "gt0", "state": "actual"}, 1.5e9),
            (DEVICE_ERRORS, {"block": "gfx", "type": "corrected"}, 3),
            (DEVICE_ERRORS, {"block": "umc", "type": "uncorrected"}, 2),
        ],
        uncorrected=2,
    )
    assert Summary.of(reading) == Summary(63.0, 45.0, 1500.0, 2, "degraded")
    assert Summary.of(Reading()) == Summary(None, None, None, None, "ok")  # no error counts: None


def test_ioctls_tsv() -> None:
    result = run("ioctls", "--output", "tsv")
    assert (result.returncode, result.stderr) == (0, "")
    lines = result.stdout.splitlines()
    assert lines[0] == "vendor\tnr\tkind\tname"
    assert lines[1] == "drm\t0xB2\talloc\tDRM_IOCTL_MODE_CREATE_DUMB"
    for row in (
        "drm\t0xC3\twait\tDRM_IOCTL_SYNCOBJ_WAIT",
        "i915\t0x69\tsubmit\tDRM_IOCTL_I915_GEM_EXECBUFFER2",
        "vgem\t0x41\tsubmit\tDRM_IOCTL_VGEM_FENCE_ATTACH",
        "virtio_gpu\t0x48\twait\tDRM_IOCTL_VIRTGPU_WAIT",
    ):
        assert row in lines
    # Every counted ioctl of every plug-in, the core table first.
    assert len(lines) - 1 == sum(len(v.ioctls) for v in (core(), *all_vendors()))
    assert [line.split("\t")[0] for line in lines[1:]] == sorted(
        (line.split("\t")[0] for line in lines[1:]),
        key=lambda name: (name != "drm", name),
    )


def test_ioctls_one_vendor_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ioctls", "vgem"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "VENDOR  NR    KIND    NAME",
        "vgem    0x41  submit  DRM_IOCTL_VGEM_FENCE_ATTACH",
    ]


def test_ioctls_core_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ioctls", "drm", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == {
        "vendor": "drm",
        "nr": 0xB2,
        "kind": "alloc",
        "name": "DRM_IOCTL_MODE_CREATE_DUMB",
    }
    assert {r["vendor"] for r in rows} == {"drm"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ioctls", "nosuch"], "unknown vendor or driver 'nosuch'"),
        (["devices", "--root", "/nonexistent"], "/nonexistent: no sys directory"),
        (["devices", "--output", "yaml"], "invalid choice: 'yaml'"),
        ([], "required: COMMAND"),
    ],
)
def test_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("kubenpuctl: error: ") and message in line


def test_needs_only_the_standard_library() -> None:
    # `pip install kubenpu` without extras must give a working kubenpuctl: block the agent's
    # dependencies, then check nothing else outside the stdlib was imported either.
    code = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {{"yaml", "grpc", "opentelemetry", "bcc", "pydantic",
                                           "prometheus_client", "google"}}:
                    raise ImportError("blocked " + name)

        sys.meta_path.insert(0, Block())
        at_start = set(sys.modules)  # site's own, e.g. setuptools' _distutils_hack
        from kubenpu.cli.ctl import main
        assert main(["devices", "--root", {str(TESTDATA / "intel-i915")!r}]) == 0
        assert main(["ioctls"]) == 0
        outside = sorted(
            m for m in {{n.split(".")[0] for n in sys.modules.keys() - at_start}}
            if m not in sys.stdlib_module_names and m != "kubenpu"
        )
        print("OUTSIDE", outside)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "OUTSIDE []"


# What kubenpuctl may load of kubenpu: discovery and the readers of sysfs, /proc and the vendor
# tables, the metric catalogue (top's names), the resolver's results, and its own modules. The
# agent's store, sampler, kernel side, exporters and wiring are not among them.
CTL_MODULES = {
    "kubenpu",
    "kubenpu.cli",
    "kubenpu.cli.ctl",
    "kubenpu.descriptors",
    "kubenpu.discovery",
    "kubenpu.sources.fdinfo",
    "kubenpu.files",
    "kubenpu.metrics",
    "kubenpu.metrics.catalogue",
    "kubenpu.resolve",
    "kubenpu.resolve.containers",
    "kubenpu.resolve.podresources",  # the kubelet socket's default, for --help
    "kubenpu.resolve.result",
    "kubenpu.sources",  # a docstring: the package's face loads nothing
    "kubenpu.sources.sysfs",
    "kubenpu.text",
    "kubenpu.cli.top",
    "kubenpu.vendors",
}
CTL_PACKAGES = ("kubenpu.cli.top.", "kubenpu.vendors.")  # and every module in them


def test_imports_no_module_of_the_agent() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import kubenpu.cli.ctl
        assert kubenpu.cli.ctl.main(["devices", "--root", {str(TESTDATA / "amd-server")!r}]) == 0
        assert kubenpu.cli.ctl.main(["ioctls"]) == 0
        print(*sorted(m for m in sys.modules if m.split(".")[0] == "kubenpu"))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.splitlines()[-1].split())
    assert {"kubenpu.sources.sysfs", "kubenpu.cli.top.view", "kubenpu.vendors.amdgpu"} <= loaded
    assert sorted(m for m in loaded - CTL_MODULES if not m.startswith(CTL_PACKAGES)) == []


def test_allocations_without_the_agent_extras_is_one_line_and_exit_2() -> None:
    code = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "grpc":
                    raise ModuleNotFoundError("No module named " + name, name=name)

        sys.meta_path.insert(0, Block())
        from kubenpu.cli.ctl import main
        sys.exit(main(["allocations"]))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "kubenpuctl: error: allocations needs the agent extras (grpc): pip install 'kubenpu[agent]'"
    ]


def test_allocations_lists_each_id_its_device_or_why_none(tmp_path: Path) -> None:
    from podresources_server import PodResourcesTestServer, container, pod

    sock = str(tmp_path / "kubelet.sock")
    server = PodResourcesTestServer(
        {
            "pods": [
                pod("ml", "a", [container("main", {"gpu.intel.com/i915": ["card1-0", "card7-0"]})]),
                pod("ml", "b", [container("main", {"example.com/x": ["uuid-1"]})]),
            ]
        }
    )
    server.start(sock)
    try:
        args = ["allocations", "--socket", sock, "--root", str(TESTDATA / "hybrid-two-gpu")]
        table, rows = run(*args).stdout, json.loads(run(*args, "-o", "json").stdout)
    finally:
        server.stop()
    assert table.splitlines() == [
        "NAMESPACE  POD  CONTAINER  RESOURCE            ID       DEVICE",
        "ml         a    main       gpu.intel.com/i915  card1-0  0000:00:02.0",
        "ml         a    main       gpu.intel.com/i915  card7-0  - (no_device)",
        "ml         b    main       example.com/x       uuid-1   - (unknown_format)",
    ]
    assert [(r["id"], r["device"], r["unmapped"]) for r in rows] == [
        ("card1-0", "0000:00:02.0", None),
        ("card7-0", None, "no_device"),
        ("uuid-1", None, "unknown_format"),
    ]


def test_allocations_kubelet_down_is_one_line(tmp_path: Path, capsys) -> None:
    assert main(["allocations", "--socket", str(tmp_path / "none.sock")]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_allocations_list_unimplemented_is_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    from podresources_server import PodResourcesTestServer

    sock = str(tmp_path / "kubelet.sock")
    server = PodResourcesTestServer({"pods": [], "fail": {"List": "UNIMPLEMENTED"}})
    server.start(sock)
    try:
        assert main(["allocations", "--socket", sock]) == 2
    finally:
        server.stop()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("kubenpuctl: error: ") and "List: UNIMPLEMENTED" in line


def test_allocations_takes_a_relative_socket_path(tmp_path: Path, monkeypatch, capsys) -> None:
    from podresources_server import PodResourcesTestServer, container, pod

    server = PodResourcesTestServer({"pods": [pod("ml", "a", [container("c", {"x/y": ["z"]})])]})
    server.start(str(tmp_path / "pod-resources" / "kubelet.sock"))
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["allocations", "--socket", "pod-resources/kubelet.sock", "-o", "json"]) == 0
    finally:
        server.stop()
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == ["z"]


def test_ioctls_takes_the_driver_name_devices_shows(capsys: pytest.CaptureFixture[str]) -> None:
    """`devices` lists driver intel_vpu; `ioctls intel_vpu` said "unknown vendor"."""
    assert main(["ioctls", "intel_vpu"]) == 0
    by_driver = capsys.readouterr().out
    assert main(["ioctls", "ivpu"]) == 0
    assert by_driver == capsys.readouterr().out
    assert by_driver.splitlines()[1].startswith("ivpu ")


def test_devices_table_shows_numa(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--root", str(TESTDATA / "amd-server")]) == 0
    lines = capsys.readouterr().out.splitlines()
    numa = lines[0].index("NUMA")
    assert [line[numa : numa + 4].strip() for line in lines[1:]] == ["0", "1"]


def copy_tree(tmp_path: Path, machine: str) -> Path:
    root = tmp_path / machine
    shutil.copytree(TESTDATA / machine, root, symlinks=True)
    return root


def run_bounded(*args: str) -> subprocess.CompletedProcess[str]:
    """kubenpuctl with a timeout: a read that blocks fails the test instead of hanging it."""
    try:
        return subprocess.run([str(KUBENPUCTL), *args], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"kubenpuctl {' '.join(args)} blocked")


HWMON = "sys/devices/pci0000:c0/0000:c0:01.1/0000:c3:00.0/hwmon/hwmon4"


@pytest.mark.parametrize(
    "fifo",
    [
        "sys/devices/pci0000:c0/0000:c0:01.1/0000:c3:00.0/numa_node",  # read by discovery
        f"{HWMON}/power1_average",  # read by telemetry
    ],
)
def test_devices_never_blocks_on_a_fifo(tmp_path: Path, fifo: str) -> None:
    """A FIFO in the tree hung `devices` for good: it was opened for reading, blocking."""
    root = copy_tree(tmp_path, "amd-server")
    (root / fifo).unlink()
    os.mkfifo(root / fifo)
    result = run_bounded("devices", "--root", str(root))
    assert result.returncode == 0
    assert "0000:c3:00.0" in result.stdout


def test_devices_escapes_control_characters_in_names(tmp_path: Path) -> None:
    """A driver link named with an escape sequence reached the terminal raw."""
    root = copy_tree(tmp_path, "amd-server")
    link = root / "sys/devices/pci0000:c0/0000:c0:01.1/0000:c3:00.0/driver"
    target = os.readlink(link)
    link.unlink()
    link.symlink_to(target.replace("amdgpu", "amd\x1b]0;owned\x07gpu"))
    result = run_bounded("devices", "--root", str(root))
    assert result.returncode == 0
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "amd\\x1b]0;owned\\x07gpu" in result.stdout


def test_devices_takes_names_with_other_scripts_digits(tmp_path: Path) -> None:
    """A directory hwmon² made `devices` print a traceback: '²'.isdigit() is true, int('²')
    raises."""
    root = copy_tree(tmp_path, "amd-server")
    (root / HWMON).with_name("hwmon²").mkdir()
    result = run_bounded("devices", "--root", str(root))
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.splitlines()[2].split()[-7:] == AMD_ROW


# --- docs/cli.md: each command's JSON, and a unit on every number's key ---------------------

CLI_DOC = (REPO / "docs/cli.md").read_text()
MACHINES = sorted(p.name for p in TESTDATA.iterdir() if (p / "sys").is_dir())
UNITS = (
    "_ns",
    "_hz",
    "_bytes",
    "_watts",
    "_celsius",
    "_mhz",
    "_seconds",
    "_percent",
    "_per_second",
)


def documented_keys(command: str) -> list[str]:
    block = re.search(rf"<!-- json {command} -->\n(.*?)<!-- end json -->", CLI_DOC, re.S)
    assert block, f"docs/cli.md documents no JSON for {command}"
    return re.findall(r"^\| `([^`]+)` \|", block[1], re.M)


def unitless_keys() -> set[str]:
    sentence = re.search(
        r"keys without a unit are\s+identifiers and counts: (.*?)\.", CLI_DOC, re.S
    )
    assert sentence
    return set(re.findall(r"`([a-z_]+)`", sentence[1]))


def flat(value: object, prefix: str = "") -> dict[str, object]:
    """Leaves by dotted path; an empty mapping (a client with no engines) has none."""
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in flat(sub, f"{prefix}{key}.").items()}
    return {prefix.removesuffix("."): value}


def check_documented(command: str, rows: list[dict[str, object]]) -> None:
    """Every key of `rows` is in docs/cli.md, every documented key occurs, and every number's
    key carries a unit (or is one of the identifiers and counts the doc lists)."""
    docs = documented_keys(command)
    patterns = {d: re.compile(re.sub(r"<[a-z]+>", r"[^.]+", re.escape(d))) for d in docs}
    seen = set()
    for row in rows:
        for key, value in flat(row).items():
            doc = [d for d, p in patterns.items() if p.fullmatch(key)]
            assert len(doc) == 1, f"{command}: key {key} is not in docs/cli.md"
            seen.add(doc[0])
            if isinstance(value, int | float) and not isinstance(value, bool):
                named = [s for s in doc[0].split(".") if not re.fullmatch(r"<[a-z]+>", s)][-1]
                named = re.sub(r"<[a-z]+>", "", named)
                assert named.endswith(UNITS) or named in unitless_keys(), f"{command}: {key}"
    assert seen == set(docs), f"{command}: documented, never seen: {set(docs) - seen}"


def json_of(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    assert main([*args, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_devices_json_is_documented(capsys: pytest.CaptureFixture[str]) -> None:
    rows = [r for m in MACHINES for r in json_of(capsys, "devices", "--root", str(TESTDATA / m))]
    check_documented("devices", rows)


def test_clients_json_is_documented(capsys: pytest.CaptureFixture[str]) -> None:
    machines = sorted(p for p in (TESTDATA / "proc").iterdir() if p.is_dir())
    rows = [r for m in machines for r in json_of(capsys, "clients", "--root", str(m))]
    check_documented("clients", rows)


def test_ioctls_json_is_documented(capsys: pytest.CaptureFixture[str]) -> None:
    check_documented("ioctls", json_of(capsys, "ioctls"))


def test_allocations_json_is_documented(tmp_path: Path, capsys) -> None:
    from podresources_server import PodResourcesTestServer, container, pod

    sock = str(tmp_path / "kubelet.sock")
    mapped = container("main", {"gpu.intel.com/i915": ["card1-0", "card7-0"]})
    server = PodResourcesTestServer({"pods": [pod("ml", "a", [mapped])]})
    server.start(sock)
    try:
        root = str(TESTDATA / "hybrid-two-gpu")
        check_documented(
            "allocations", json_of(capsys, "allocations", "--socket", sock, "--root", root)
        )
    finally:
        server.stop()


def test_devices_with_none_says_so_in_a_line(tmp_path: Path, capsys) -> None:
    """A bare header read like a failure to read."""
    (tmp_path / "sys").mkdir()
    assert main(["devices", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"no DRM or accel device under {tmp_path}/sys/class (drm, accel): no GPU or NPU driver "
        "is loaded, or this is not the node's /sys\n"
    )
    assert main(["devices", "--root", str(tmp_path), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_allocations_on_a_socket_no_kubelet_serves_is_one_clear_line(tmp_path: Path, capsys):
    """gRPC's raw error (three nested messages) became one line that says what to do."""
    import socket

    stale = tmp_path / "kubelet.sock"
    with socket.socket(socket.AF_UNIX) as s:  # a socket file the kubelet left: connect refused
        s.bind(str(stale))
    assert main(["allocations", "--socket", str(stale)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"kubenpuctl: error: the kubelet does not answer at {stale}: is it running?"
    assert main(["allocations", "--socket", str(tmp_path / "none.sock")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"kubenpuctl: error: no kubelet PodResources socket at {tmp_path}/")


@pytest.mark.parametrize("name", ["nvidia", "nvidia-drm", "NVIDIA"])
def test_ioctls_of_nvidia_says_it_is_out_of_scope(name: str, capsys) -> None:
    assert main(["ioctls", name]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"kubenpuctl: error: {name}: NVIDIA is out of scope: ")
    assert "DCGM" in line
