"""kubenpu-agent's config at --check-config and at start: the same checks, the same lines.

`--check-config` passed a config whose password_file was missing, and the start then exited 2
on it; a directory given as a TLS or secret file was a traceback at both. Every file the config
names is now checked once, by export.check, for both.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kubenpu import agent, config
from kubenpu.kernel.errors import ProbeError

PREFIX = "kubenpu-agent: "


@pytest.fixture(autouse=True)
def no_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config the checks let through would start a real agent: here it fails instead."""

    def build(*_: object) -> None:
        raise AssertionError("the start went past the config checks")

    monkeypatch.setattr(agent, "build", build)


def missing(p: Path) -> None:
    pass


def directory(p: Path) -> None:
    p.mkdir()


def fifo(p: Path) -> None:
    os.mkfifo(p)  # opened for reading, it would block the start until a writer came


def unreadable(p: Path) -> None:
    # Unreadable even for root, who reads a chmod 000 file: read() fails with EIO.
    p.symlink_to("/proc/self/mem")


def empty(p: Path) -> None:
    p.write_text("\n")


def not_pem(p: Path) -> None:
    p.write_text("not a certificate\n")


OTLP = "otlp: {enabled: true, "
SETTINGS = {  # each file setting, as YAML under export: @F@ the file under test, @OK@ a good one
    "export.prometheus.tls.cert_file": "prometheus: {tls: {cert_file: @F@, key_file: @OK@}}",
    "export.prometheus.tls.key_file": "prometheus: {tls: {cert_file: @OK@, key_file: @F@}}",
    "export.prometheus.auth.password_file": "prometheus: {auth: {username: p, password_file: @F@}}",
    "export.prometheus.auth.bearer_token_file": "prometheus: {auth: {bearer_token_file: @F@}}",
    "export.otlp.certificate": f"{OTLP}certificate: @F@}}",
    "export.otlp.client_certificate": f"{OTLP}client_certificate: @F@, client_key: @OK@}}",
    "export.otlp.client_key": f"{OTLP}client_certificate: @OK@, client_key: @F@}}",
}
FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing": (missing, ": No such file or directory"),
    "directory": (directory, ": a directory, not a regular file"),
    "fifo": (fifo, ": a FIFO, not a regular file"),
    "unreadable": (unreadable, ": Input/output error"),
}


def write_config(tmp_path: Path, setting: str, make: Callable[[Path], None]) -> tuple[str, Path]:
    target, ok = tmp_path / "file-under-test", tmp_path / "ok.pem"
    make(target)
    ok.write_text("ok\n")
    text = SETTINGS[setting].replace("@OK@", str(ok)).replace("@F@", str(target))
    path = tmp_path / "kubenpu.yaml"
    path.write_text(f"node_name: n\nexport:\n  {text}\n")
    return str(path), target


def check_then_start(path: str, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], list[str]]:
    """The problem lines of --check-config and of a start, each with exit status 2."""
    assert agent.main(["--check-config", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    checked = captured.err.splitlines()
    assert agent.main(["--config", path]) == 2  # only after the check refused it: never a start
    started = capsys.readouterr().err.splitlines()
    assert all(line.startswith(PREFIX) for line in started), started
    return checked, [line.removeprefix(PREFIX) for line in started]


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("setting", SETTINGS)
def test_each_file_fault_is_the_same_one_line_at_check_and_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], setting: str, fault: str
) -> None:
    make, reason = FAULTS[fault]
    path, target = write_config(tmp_path, setting, make)
    checked, started = check_then_start(path, capsys)
    assert checked == started == [f"cannot read {setting} {target}{reason}"]


@pytest.mark.parametrize(
    "setting", ["export.prometheus.auth.password_file", "export.prometheus.auth.bearer_token_file"]
)
def test_an_empty_secret_is_refused_at_check_and_start(tmp_path, capsys, setting) -> None:
    path, target = write_config(tmp_path, setting, empty)
    checked, started = check_then_start(path, capsys)
    assert checked == started == [f"{setting} {target} is empty"]


def test_a_certificate_that_does_not_load_is_refused_at_check_and_start(tmp_path, capsys) -> None:
    path, _ = write_config(tmp_path, "export.prometheus.tls.cert_file", not_pem)
    checked, started = check_then_start(path, capsys)
    assert checked == started
    (line,) = checked
    assert line.startswith("cannot load export.prometheus.tls cert_file ")


def test_no_config_file_starts_on_the_defaults_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A bare kubenpu-agent refused to start without /etc/kubenpu/config.yaml."""
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "none.yaml"))
    monkeypatch.setenv("K8S_NODE_NAME", "node-a")
    built: list[config.Config] = []

    def build(cfg: config.Config, *_: object) -> None:  # the start past the config: not here
        built.append(cfg)
        raise ProbeError("not loading a probe in a unit test")

    monkeypatch.setattr(agent, "build", build)
    monkeypatch.setattr(agent, "raise_nofile", lambda: 0)
    caplog.set_level("INFO", logger="kubenpu")
    assert agent.main([]) == 2
    assert built == [config.Config(node_name="node-a")]
    assert f"no config file at {tmp_path / 'none.yaml'}: running on the defaults" in caplog.text


def test_a_config_file_that_was_named_must_exist(tmp_path: Path, capsys) -> None:
    assert agent.main(["--config", str(tmp_path / "typo.yaml")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"{PREFIX}{tmp_path / 'typo.yaml'}: cannot read: No such file or directory"


class Libc:
    """glibc's mallopt as far as the agent uses it: 1 for a known parameter, 0 otherwise."""

    def __init__(self) -> None:
        self.set: dict[int, int] = {}

    def mallopt(self, param: int, value: int) -> int:
        if param not in (-3, -8):  # M_MMAP_THRESHOLD, M_ARENA_MAX
            return 0
        self.set[param] = value
        return 1


def test_malloc_is_bounded_unless_the_environment_says_otherwise(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    libc = Libc()
    assert agent.bound_malloc(libc) == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX"]
    assert libc.set == {-3: 128 * 1024, -8: 2}
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # glibc read it at exec: not overridden
    libc = Libc()
    assert agent.bound_malloc(libc) == ["MALLOC_MMAP_THRESHOLD_"] and libc.set == {-3: 131072}
    assert agent.bound_malloc(object()) == []  # a C library without mallopt (musl)


def test_this_machines_glibc_takes_both_settings(monkeypatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    assert agent.bound_malloc() == ["MALLOC_MMAP_THRESHOLD_", "MALLOC_ARENA_MAX"]
