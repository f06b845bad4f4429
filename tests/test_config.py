"""kubenpu.config: the example file, the docs, bad input, and the OTEL_* precedence."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
        is_section = isinstance(v, dict) and k not in ("headers", "namespaces")  # maps
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
        ("export: {otlp: [1]}\n", "export.otlp: expected a mapping of keys"),
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


# --- config that cannot lie: ranges, header keys, resource attributes, bounded errors, secrets


def problems_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(config.ConfigError) as err:
        config.load(write(tmp_path, text), env or {})
    return err.value.problems


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("export: {otlp: {interval_seconds: .inf}}", "export.otlp.interval_seconds"),
        ("export: {otlp: {interval_seconds: 1.0e+20}}", "export.otlp.interval_seconds"),
        ("export: {otlp: {timeout_seconds: .nan}}", "export.otlp.timeout_seconds"),
        ("attribution: {cri: {timeout_seconds: 1.0e+10}}", "attribution.cri.timeout_seconds"),
        ("attribution: {cri: {retry_after_seconds: .inf}}", "attribution.cri.retry_after_seconds"),
        ("attribution: {cri: {concurrency: 0}}", "attribution.cri.concurrency"),
        ("attribution: {pending_seconds: 1.0e+9}", "attribution.pending_seconds"),
        ("metrics: {series_ttl_seconds: .inf}", "metrics.series_ttl_seconds"),
        ("metrics: {max_series: 100000000000}", "metrics.max_series"),
        ("probe: {ringbuf_pages: 1073741824}", "probe.ringbuf_pages"),
        ("probe: {queue_size: 100000000000}", "probe.queue_size"),
        ("export: {prometheus: {max_connections: 1000000}}", "export.prometheus.max_connections"),
        (
            "export: {prometheus: {read_timeout_seconds: .inf}}",
            "export.prometheus.read_timeout_seconds",
        ),
    ],
)
def test_every_duration_and_size_has_an_upper_bound(tmp_path: Path, text: str, key: str) -> None:
    [problem] = problems_of(tmp_path, text)
    assert problem.startswith(f"{tmp_path / 'c.yaml'}: {key}: ")


@pytest.mark.parametrize("pages", [0, -256])
def test_a_ring_buffer_of_no_pages_is_rejected(tmp_path: Path, pages: int) -> None:
    [line] = problems_of(tmp_path, f"probe: {{ringbuf_pages: {pages}}}")
    assert line.startswith(f"{tmp_path / 'c.yaml'}: probe.ringbuf_pages: ")


@pytest.mark.parametrize("var", ["OTEL_METRIC_EXPORT_INTERVAL", "OTEL_EXPORTER_OTLP_TIMEOUT"])
@pytest.mark.parametrize("value", ["inf", "1e400", "nan", "1e20"])
def test_env_durations_have_an_upper_bound(tmp_path: Path, var: str, value: str) -> None:
    [problem] = problems_of(tmp_path, "", {var: value})
    assert problem.startswith(f"env {var}: export.otlp.")


def test_header_keys_are_lowercased_as_the_otel_sdk_does(tmp_path: Path) -> None:
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t0k,X-Tenant=a"}
    assert config.load(write(tmp_path, ""), env).export.otlp.headers == {
        "authorization": "Bearer t0k",
        "x-tenant": "a",
    }
    text = "export: {otlp: {headers: {Authorization: Bearer y}}}"
    assert config.load(write(tmp_path, text), {}).export.otlp.headers == {
        "authorization": "Bearer y"
    }


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ("", {"OTEL_EXPORTER_OTLP_HEADERS": "bad key=s3cret"}),
        ("", {"OTEL_EXPORTER_OTLP_METRICS_HEADERS": "authorization=s3cret\x01"}),
        ("", {"OTEL_EXPORTER_OTLP_HEADERS": "grpc-timeout=s3cret"}),
        ("export: {otlp: {headers: {'a:b': s3cret}}}", {}),
        ('export: {otlp: {headers: {authorization: "s3cret\\u00e9"}}}', {}),
        ("", {"OTEL_EXPORTER_OTLP_HEADERS": "k" * 257 + "=s3cret"}),  # keys were unbounded
    ],
)
def test_invalid_headers_one_line_without_the_value(tmp_path: Path, text, env) -> None:
    [problem] = problems_of(tmp_path, text, env)
    assert "header" in problem
    assert "s3cret" not in problem


def test_malformed_resource_attributes_one_line(tmp_path: Path) -> None:
    ok = {"OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=c1,team=a%20b"}
    assert config.load(write(tmp_path, ""), ok)
    [problem] = problems_of(tmp_path, "", {"OTEL_RESOURCE_ATTRIBUTES": "k8s.cluster.name=c1,oops"})
    assert problem == "env OTEL_RESOURCE_ATTRIBUTES: 'oops' is not key=value"


def test_non_utf8_file_one_line_exit_2(tmp_path: Path, capsys) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("node_name: caf\xe9\n".encode("latin-1"))
    assert config.check_config(str(path)) == 2
    captured = capsys.readouterr()
    assert captured.err == f"{path}: not UTF-8 text (byte 14)\n"


# A 342-byte YAML "billion laughs": 9^9 strings once expanded, under a mistyped key.
ALIAS_BOMB = 'bogus:\n  a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"  {n}: &{n} [{','.join([f'*{p}'] * 9)}]\n"
    for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)


@pytest.mark.parametrize(
    "text",
    [
        ALIAS_BOMB,
        ALIAS_BOMB + "discovery: {ignore_devices: *i}\n",
        ALIAS_BOMB + "node_name: *i\n",
    ],
)
def test_alias_bomb_one_bounded_line(tmp_path: Path, capsys, text: str) -> None:
    path = write(tmp_path, text)
    assert config.check_config(path) == 2
    err = capsys.readouterr().err
    assert err == f"{path}: invalid YAML: more than 10000 values once aliases are expanded\n"


def test_a_small_alias_is_fine(tmp_path: Path) -> None:
    text = "discovery:\n  ignore_devices: &ids ['0000:03:00.0']\nx: *ids\n"
    assert problems_of(tmp_path, text) == [f"{tmp_path / 'c.yaml'}: x: unknown key"]


@pytest.mark.parametrize(
    "text",
    [
        f"node_name: [{', '.join(['x' * 100] * 90)}]\n",
        f"{'k' * 5000}: 1\n",
        f"export: {{otlp: {{endpoint: '{'h' * 5000}'}}}}\n",
        f"probe: {{mode: '{'m' * 5000}'}}\n",
    ],
)
def test_error_lines_never_echo_unbounded_input(tmp_path: Path, text: str) -> None:
    [problem] = problems_of(tmp_path, text)
    assert len(problem) < len(str(tmp_path)) + 300


def test_oversized_file_one_line(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path, "#" * (config.MAX_FILE_BYTES + 1))
    assert problem.endswith(f"larger than {config.MAX_FILE_BYTES} bytes")


def test_check_config_redacts_secrets(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20s3cret,x-tenant=t1")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://user:pa55@collector:4317")
    assert config.check_config(write(tmp_path, "")) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out and "pa55" not in out and "t1" not in out
    otlp = yaml.safe_load(out)["export"]["otlp"]
    assert otlp["headers"] == {"authorization": "<redacted>", "x-tenant": "<redacted>"}
    assert otlp["endpoint"] == "https://user:<redacted>@collector:4317"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("export: {prometheus: {tls: {cert_file: /c.pem}}}", "cert_file and key_file go together"),
        ("export: {prometheus: {auth: {username: u}}}", "username and password_file go together"),
    ],
)
def test_tls_and_basic_auth_need_both_halves(tmp_path: Path, text: str, problem: str) -> None:
    [line] = problems_of(tmp_path, text)
    assert problem in line


def test_cri_endpoint_default_has_one_owner() -> None:
    from kubenpu.resolve import DEFAULT_ENDPOINT

    assert config.Config().attribution.cri.endpoint == DEFAULT_ENDPOINT


def test_loading_the_config_does_not_scan_the_installed_packages():
    """pydantic looks for plugins in every installed distribution's entry points unless told
    not to; the scan is a large part of a start under TCG."""
    probe = (
        "import importlib.metadata as m\n"
        "scans = []\n"
        "real = m.distributions\n"
        "m.distributions = lambda *a, **k: scans.append(1) or real(*a, **k)\n"
        "from kubenpu import config\n"
        "config.Config()\n"
        "print(len(scans))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


@pytest.mark.parametrize(
    ("text", "env"),
    [
        ('export: {otlp: {endpoint: "http://c:4318/v1/metrics\\r\\nX-Injected: 1"}}\n', {}),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318\r\nX-Injected: 1"}),
        ("", {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://c:4317\t"}),
    ],
)
def test_control_characters_in_an_endpoint_are_refused(tmp_path: Path, text: str, env) -> None:
    """CR/LF passed --check-config; HTTP then pushed to /v1/metrics%0D%0AX-Injected:%201."""
    with pytest.raises(config.ConfigError) as err:
        config.load(write(tmp_path, text), env)
    [problem] = err.value.problems
    assert "export.otlp.endpoint" in problem and "holds a control character" in problem


@pytest.mark.parametrize("where", ["yaml", "env"])
def test_node_name_has_a_length_bound(tmp_path: Path, where: str) -> None:
    """1 MB was accepted, and then labelled every series."""
    name = "n" * 1_000_000
    text, env = (f"node_name: {name}\n", {}) if where == "yaml" else ("", {"K8S_NODE_NAME": name})
    with pytest.raises(config.ConfigError) as err:
        config.load(write(tmp_path, text), env)
    [problem] = err.value.problems
    assert "node_name" in problem or "K8S_NODE_NAME" in problem
    assert len(problem) < 300
    config.load(write(tmp_path, "node_name: " + "n" * 253 + "\n"), {})  # the limit itself


@pytest.mark.parametrize(
    ("yaml_text", "problem"),
    [
        ("attribution:\n  pod_resources:\n    socket: kubelet.sock\n", "absolute socket path"),
        ("attribution:\n  pod_resources:\n    interval_seconds: 0\n", "greater than 0"),
        ("attribution:\n  pod_resources:\n    enabled: 'yes'\n", "valid boolean"),
    ],
)
def test_pod_resources_validated(tmp_path: Path, yaml_text: str, problem: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    with pytest.raises(config.ConfigError) as err:
        config.load(path)
    assert problem in " ".join(err.value.problems)


@pytest.mark.parametrize(
    ("text", "where", "key", "first"),
    [
        ("probe:\n  mode: events\nprobe:\n  mode: aggregate\n", ":3:1:", "probe", 1),
        ("export:\n  prometheus:\n    port: 1\n    port: 2\n", ":4:5:", "port", 3),
        ("probe: {mode: events, mode: aggregate}\n", ":1:23:", "mode", 1),
    ],
)
def test_a_duplicate_key_is_an_error_naming_its_line(
    tmp_path: Path, text: str, where: str, key: str, first: int
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(config.ConfigError) as err:
        config.load(path, ENV)
    assert err.value.problems == [
        f"{path}{where} invalid YAML: duplicate key {key!r} (first on line {first})"
    ]


def test_a_merge_key_may_override_what_it_merges(tmp_path: Path) -> None:
    text = 'export:\n  otlp:\n    headers: {<<: {x-a: "1", x-b: "2"}, x-a: "3"}\n'
    cfg = config.load(write(tmp_path, text), ENV)
    assert cfg.export.otlp.headers == {"x-a": "3", "x-b": "2"}


def model_classes(model: type[BaseModel] = config.Config) -> set[str]:
    names = {model.__name__}
    for f in model.model_fields.values():
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
            names |= model_classes(f.annotation)
    return names


@pytest.mark.parametrize("section", sorted(k for k in schema_keys() if "." in k))
def test_an_empty_or_wrong_section_names_the_key_not_a_class(tmp_path: Path, section: str) -> None:
    """An empty `probe:` (YAML null) once said "a valid dictionary or instance of ProbeConfig"."""
    parent = section.rpartition(".")[0]
    *outer, last = parent.split(".")
    text = "".join(f"{'  ' * i}{k}:\n" for i, k in enumerate(outer)) + f"{'  ' * len(outer)}{last}:"
    for value in ("", " 3", " [a]"):
        with pytest.raises(config.ConfigError) as err:
            config.load(write(tmp_path, text + value + "\n"), ENV)
        (line,) = err.value.problems
        assert f": {parent}: expected a mapping of keys" in line
        assert not any(name in line for name in model_classes()), line


def test_no_file_is_the_defaults(monkeypatch) -> None:
    assert config.load(None, ENV) == config.Config(node_name="node-a")
    monkeypatch.setattr(config, "DEFAULT_PATH", "/nonexistent/kubenpu.yaml")
    assert config.path_to_load("/nonexistent/kubenpu.yaml") is None
    assert config.path_to_load("/given.yaml") == "/given.yaml"  # a given file must be there


def test_without_a_file_an_env_error_names_the_variable() -> None:
    env = {**ENV, "OTEL_EXPORTER_OTLP_PROTOCOL": "smoke"}
    with pytest.raises(config.ConfigError) as err:
        config.load(None, env)
    assert err.value.problems == [
        "env OTEL_EXPORTER_OTLP_PROTOCOL: export.otlp.protocol: Input should be 'grpc' or "
        "'http/protobuf' (got 'smoke')"
    ]
