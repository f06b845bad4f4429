"""drmcall (tests/vm/src/drmcall.c), the VM tests' one workload generator, and guestlib's side of
it: built with the host's gcc and run against /dev/null, whose ioctl entry rejects every call (as
a DRM driver may; drmcall counts calls made, not accepted). The guests run the same source.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from guestlib import CREATE_DUMB, TCGETS, Call, drmcall_argv, reports

SOURCE = Path(__file__).resolve().parent / "src" / "drmcall.c"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@pytest.fixture(scope="module")
def drmcall(tmp_path_factory) -> str:
    binary = tmp_path_factory.mktemp("drmcall") / "drmcall"
    subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", binary, SOURCE], check=True)
    return str(binary)


def run(drmcall: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([drmcall, *argv], capture_output=True, text=True, check=False)


def test_steps_are_reported_in_order_with_the_request_issued(drmcall):
    calls = [Call.drm("/dev/null", CREATE_DUMB, 5), Call("/dev/null", TCGETS, 64, 4, raw=True)]
    done = run(drmcall, drmcall_argv(calls)[1:])
    assert done.returncode == 0, done.stderr
    found = reports(done.stdout, calls)
    # DRM_IOWR(0xB2, 32) = _IOC(READ|WRITE, 'd', 0xB2, 32); --raw: the request as given.
    assert [(r["cmd"], r["calls"]) for r in found] == [(0xC02064B2, 5), (TCGETS, 4)]


def test_cgroup_is_entered_before_the_steps(drmcall, tmp_path):
    """--cgroup writes the process's pid to DIR/cgroup.procs (a plain file here)."""
    calls = [Call.drm("/dev/null", CREATE_DUMB, 1)]
    done = run(drmcall, drmcall_argv(calls, tmp_path)[1:])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "cgroup.procs").read_text().strip().isdigit()


def test_a_missing_cgroup_fails_the_run(drmcall, tmp_path):
    done = run(drmcall, ["--cgroup", str(tmp_path / "none"), "/dev/null", "0xb2", "32", "1"])
    assert (done.returncode, done.stdout) == (1, "")
    assert "cgroup.procs" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [[], ["/dev/null", "0xb2", "32"], ["--raw"], ["/dev/null", "0xb2", "4097", "1"]],
    ids=["no-step", "short-step", "raw-alone", "size-too-large"],
)
def test_bad_command_lines_exit_2(drmcall, argv):
    done = run(drmcall, argv)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.strip()


def test_reports_must_match_what_was_asked():
    calls = [Call.drm("/dev/null", CREATE_DUMB, 5)]
    line = '{"device": "/dev/null", "cmd": 3223348402, "calls": %d, "seconds": 0.1}'
    assert reports(line % 5, calls)[0]["calls"] == 5
    for wrong in (line % 4, "", f"{line % 5}\n{line % 5}"):
        with pytest.raises(SystemExit, match="drmcall did not do what was asked"):
            reports(wrong, calls)


def test_wait_signal_holds_the_steps_after_it_until_sigusr1(drmcall):
    """--wait-signal: the steps before it run, it says it waits, and the rest follow SIGUSR1."""
    argv = [
        drmcall,
        "/dev/null",
        "0xb2",
        "32",
        "1",
        "--wait-signal",
        "/dev/null",
        "0xb2",
        "32",
        "2",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert '"calls": 1' in first
    assert proc.stdout.readline().strip() == '{"waiting": true}'
    assert proc.poll() is None  # waiting, not done
    proc.send_signal(signal.SIGUSR1)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert '"calls": 2' in rest


def test_failed_calls_are_counted_by_errno(drmcall):
    """/dev/null rejects every ioctl with ENOTTY: each step reports how many."""
    done = run(drmcall, ["--raw", "/dev/null", "0x5401", "64", "3", "/dev/null", "0xC3", "40", "2"])
    assert done.returncode == 0, done.stderr
    calls = [Call("/dev/null", 0x5401, 64, 3, raw=True), Call("/dev/null", 0xC3, 40, 2)]
    assert [r["errnos"] for r in reports(done.stdout, calls)] == [{"25": 3}, {"25": 2}]
