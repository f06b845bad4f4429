"""kubenpu.config: the example file, the docs, bad input, and the OTEL_* precedence."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from kubenpu import config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config" / "kubenpu.yaml"
ENV = {"K8S_NODE_NAME": "node-a"}


def schema_keys(model: type[BaseModel] = config.Config, prefix: str = "") -> set[str]:
    keys = set()
    for name, f in model.model_fields.items():
        sub = f.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            keys |= schema_keys(sub, f"{prefix}{name}.")
        else:
            keys.add(prefix + name)
    return keys


def yaml_keys(raw: dict[str, Any], prefix: str = "") -> set[str]:
    keys = set()
    for k, v in raw.items():
        is_section = isinstance(v, dict) and k != "headers"
        keys |= yaml_keys(v, f"{prefix}{k}.") if is_section else {prefix + k}
    return keys


def write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_example_holds_every_key_and_equals_the_defaults() -> None:
    assert yaml_keys(yaml.safe_load(EXAMPLE.read_text())) == schema_keys()
    expected = config.Config(node_name="node-a")
    assert config.load(str(EXAMPLE), ENV) == expected


def test_docs_list_every_key() -> None:
    documented = set(
        re.findall(r"^\| `([a-z_.]+)` \|", (ROOT / "docs/configuration.md").read_text(), re.M)
    )
    assert documented == schema_keys()


def test_check_config_prints_the_effective_config(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317")
    monkeypatch.setenv("K8S_NODE_NAME", "node-b")
    original = write(tmp_path, "metrics: {max_series: 5}\n")
    assert config.check_config(original) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["metrics"]["max_series"] == 5
    assert out["export"]["otlp"]["endpoint"] == "https://collector:4317"
    assert out["node_name"] == "node-b"
    # The printed config is itself a valid config that loads to the same result.
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(out))
    assert config.load(str(again)) == config.load(original)


BAD = """\
node_name: 3
bogus: 1
probe:
  ringbuf_pages: 100
export:
  prometheus: {port: "8080"}
  otlp: {protocol: http/json, insecure: maybe, endpoint: "localhost:4317"}
"""


def test_bad_config_one_line_per_problem_exit_2(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, BAD)
    assert config.check_config(path) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    expect = [
        "node_name:",
        "bogus: unknown key",
        "probe.ringbuf_pages: must be a power of two",
        "export.prometheus.port:",
        "export.otlp.protocol:",
        "export.otlp.insecure:",
        "export.otlp.endpoint:",
    ]
    assert len(lines) == len(expect)
    for want in expect:
        assert sum(line.startswith(f"{path}: {want}") for line in lines) == 1, want


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "cannot read: No such file or directory"),
        ("a: [\n", ":2:1: invalid YAML:"),
        ("- a\n", "expected a mapping"),
        ("export: {otlp: [1]}\n", "export.otlp: Input should be"),
    ],
)
def test_unreadable_or_malformed_files(tmp_path: Path, text: str | None, problem: str) -> None:
    path = str(tmp_path / "missing.yaml") if text is None else write(tmp_path, text)
    with pytest.raises(config.ConfigError) as err:
        config.load(path, {})
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(path)
    assert problem in err.value.problems[0]


def test_bad_env_values_name_the_variable(tmp_path: Path) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_HEADERS": "a=b,c",
        "OTEL_METRIC_EXPORT_INTERVAL": "soon",
        "OTEL_EXPORTER_OTLP_INSECURE": "yes",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
    }
    with pytest.raises(config.ConfigError) as err:
        config.load(write(tmp_path, ""), env)
    problems = err.value.problems
    assert len(problems) == 4
    for var in env:
        assert sum(p.startswith(f"env {var}") for p in problems) == 1, var


OTLP_YAML = """\
export:
  otlp:
    endpoint: http://yaml:4317
    headers: {from: yaml}
    insecure: false
    certificate: /yaml/ca.pem
    interval_seconds: 30
    timeout_seconds: 5
"""


def test_env_wins_over_yaml(tmp_path: Path) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4317",
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t0k,x-b=2",
        "OTEL_EXPORTER_OTLP_INSECURE": "TRUE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE": "/env/ca.pem",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_METRIC_EXPORT_INTERVAL": "1500",
    }
    path = write(tmp_path, OTLP_YAML)
    o = config.load(path, env).export.otlp
    assert (o.endpoint, o.headers, o.insecure, o.certificate) == (
        "http://env:4317",
        {"authorization": "Bearer t0k", "x-b": "2"},
        True,
        "/env/ca.pem",
    )
    assert (o.timeout_seconds, o.interval_seconds) == (2.5, 1.5)
    y = config.load(path, {}).export.otlp
    assert (y.endpoint, y.headers, y.insecure, y.interval_seconds) == (
        "http://yaml:4317",
        {"from": "yaml"},
        False,
        30,
    )


def test_metrics_specific_variables_win_over_generic(tmp_path: Path) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://specific:9090/api/v1/otlp/v1/metrics",
        "OTEL_EXPORTER_OTLP_HEADERS": "a=generic",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "a=specific",
    }
    o = config.load(write(tmp_path, ""), env).export.otlp
    assert o.protocol == "http/protobuf"
    assert o.url() == "http://specific:9090/api/v1/otlp/v1/metrics"  # used as is, per the spec
    assert o.headers == {"a": "specific"}


@pytest.mark.parametrize(
    ("yaml_text", "env", "url"),
    [
        # The generic variable is a base URL: /v1/metrics is appended for HTTP, even after a path.
        (
            "",
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://prom:9090/api/v1/otlp",
            },
            "http://prom:9090/api/v1/otlp/v1/metrics",
        ),
        # No endpoint anywhere: the protocol's default port.
        ("export: {otlp: {protocol: http/protobuf}}", {}, "http://localhost:4318/v1/metrics"),
        ("", {}, "http://localhost:4317"),
        # YAML: a URL without a path gets /v1/metrics; one with a path is used as is.
        (
            "export: {otlp: {protocol: http/protobuf, endpoint: 'http://c:4318'}}",
            {},
            "http://c:4318/v1/metrics",
        ),
        (
            "export: {otlp: {protocol: http/protobuf, endpoint: 'http://c:1/x/v1/metrics'}}",
            {},
            "http://c:1/x/v1/metrics",
        ),
        (
            "",
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://grpc:4317/ignored"},
            "https://grpc:4317/ignored",
        ),
    ],
)
def test_endpoint_resolution(tmp_path: Path, yaml_text: str, env: dict[str, str], url: str):
    assert config.load(write(tmp_path, yaml_text), env).export.otlp.url() == url


@pytest.mark.parametrize(
    ("value", "otlp", "prometheus"),
    [("otlp", True, False), ("prometheus,otlp", True, True), ("none", False, False)],
)
def test_otel_metrics_exporter_selects_exporters(tmp_path, value, otlp, prometheus) -> None:
    cfg = config.load(write(tmp_path, ""), {"OTEL_METRICS_EXPORTER": value})
    assert (cfg.export.otlp.enabled, cfg.export.prometheus.enabled) == (otlp, prometheus)


def test_node_name(tmp_path: Path, monkeypatch) -> None:
    empty = write(tmp_path, "")
    assert config.load(empty, {"K8S_NODE_NAME": "k"}).node_name == "k"
    monkeypatch.setattr(config.socket, "gethostname", lambda: "host-1")
    assert config.load(empty, {}).node_name == "host-1"
    assert config.load(write(tmp_path, "node_name: mine"), {"K8S_NODE_NAME": "k"}).node_name == (
        "mine"
    )


@pytest.mark.parametrize(
    ("protocol", "endpoint", "insecure", "tls"),
    [
        ("grpc", "http://c:4317", None, False),
        ("grpc", "https://c:4317", None, True),
        ("grpc", "http://c:4317", False, True),
        ("grpc", "https://c:4317", True, False),
        ("http/protobuf", "https://c:4318", True, True),
    ],
)
def test_tls_choice(protocol: str, endpoint: str, insecure: bool | None, tls: bool) -> None:
    o = config.OtlpConfig(protocol=protocol, endpoint=endpoint, insecure=insecure)
    assert o.use_tls() is tls
