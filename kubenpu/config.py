"""The agent's YAML configuration, merged with the standard OTEL_* environment variables.

Precedence, highest first: OTEL_EXPORTER_OTLP_METRICS_* (signal-specific), OTEL_EXPORTER_OTLP_*
(generic), OTEL_METRIC_EXPORT_INTERVAL and OTEL_METRICS_EXPORTER, then the YAML file, then the
defaults below. This follows the OpenTelemetry specification, where the environment configures an
SDK. `node_name` is the exception: a non-empty YAML value wins over K8S_NODE_NAME.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

_HTTP_METRICS_PATH = "/v1/metrics"


class _Model(BaseModel):
    # strict: a YAML string "8080" is a mistake worth reporting, not something to coerce.
    model_config = ConfigDict(extra="forbid", strict=True)


class ProbeConfig(_Model):
    mode: Literal["aggregate", "events"] = "aggregate"
    attach: Literal["auto", "fentry", "kprobe"] = "auto"
    ringbuf_pages: int = Field(256, gt=0)
    queue_size: int = Field(65536, gt=0)

    @field_validator("ringbuf_pages")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError("must be a power of two")
        return v


class DiscoveryConfig(_Model):
    root: str = "/"
    ignore_devices: list[str] = []


class CriConfig(_Model):
    endpoint: str = "unix:///run/containerd/containerd.sock"
    timeout_seconds: float = Field(2, gt=0)
    retry_after_seconds: float = Field(30, ge=0)


class AttributionConfig(_Model):
    cgroup_root: str = "/sys/fs/cgroup"
    cri: CriConfig = CriConfig()


class MetricsConfig(_Model):
    series_ttl_seconds: float = Field(300, ge=0)
    max_series: int = Field(10000, gt=0)


class FdinfoConfig(_Model):
    enabled: bool = True
    interval_seconds: float = Field(5, gt=0)


class PrometheusConfig(_Model):
    enabled: bool = True
    host: str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65535)


class OtlpConfig(_Model):
    enabled: bool = False
    endpoint: str = "http://localhost:4317"
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    headers: dict[str, str] = {}
    insecure: bool | None = None
    certificate: str = ""
    client_certificate: str = ""
    client_key: str = ""
    interval_seconds: float = Field(15, gt=0)
    timeout_seconds: float = Field(10, gt=0)

    @field_validator("endpoint")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{v!r} is not an http:// or https:// URL")
        return v

    def url(self) -> str:
        """The endpoint the exporter uses: http/protobuf gets /v1/metrics when no path is given."""
        if self.protocol == "http/protobuf" and urlsplit(self.endpoint).path in ("", "/"):
            return self.endpoint.rstrip("/") + _HTTP_METRICS_PATH
        return self.endpoint

    def use_tls(self) -> bool:
        """gRPC: `insecure` decides when set, else the scheme; HTTP: always the scheme."""
        if self.protocol == "grpc" and self.insecure is not None:
            return not self.insecure
        return urlsplit(self.endpoint).scheme == "https"


class ExportConfig(_Model):
    prometheus: PrometheusConfig = PrometheusConfig()
    otlp: OtlpConfig = OtlpConfig()


class Config(_Model):
    node_name: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    probe: ProbeConfig = ProbeConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    attribution: AttributionConfig = AttributionConfig()
    metrics: MetricsConfig = MetricsConfig()
    fdinfo: FdinfoConfig = FdinfoConfig()
    export: ExportConfig = ExportConfig()


class ConfigError(Exception):
    """Every problem found, one line each, naming the key and where its value came from."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


# (suffix, otlp key, parser). The METRICS_ variant of each suffix wins over the generic one.
def _ms(v: str) -> float:
    return float(v) / 1000


def _bool(v: str) -> bool:
    if v.strip().lower() not in ("true", "false"):
        raise ValueError("expected true or false")
    return v.strip().lower() == "true"


def _headers(v: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (s.strip() for s in v.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not key=value")
        out[unquote(key.strip())] = unquote(value.strip())
    return out


_OTLP_ENV = (
    ("PROTOCOL", "protocol", str),
    ("ENDPOINT", "endpoint", str),
    ("HEADERS", "headers", _headers),
    ("INSECURE", "insecure", _bool),
    ("CERTIFICATE", "certificate", str),
    ("CLIENT_CERTIFICATE", "client_certificate", str),
    ("CLIENT_KEY", "client_key", str),
    ("TIMEOUT", "timeout_seconds", _ms),
)


def _apply_env(raw: dict[str, Any], env: Mapping[str, str], sources: dict[str, str]) -> list[str]:
    """Overlay the OTEL_* variables on the raw YAML dict; return problems in their values."""
    problems: list[str] = []
    export = raw.setdefault("export", {})
    if not isinstance(export, dict) or not isinstance(export.setdefault("otlp", {}), dict):
        return problems  # the YAML is already wrong here; validation reports it
    otlp = export["otlp"]

    def put(var: str, key: str, parse: Any, target: dict[str, Any], path: str) -> None:
        try:
            target[key] = parse(env[var])
            sources[path] = f"env {var}"
        except ValueError as err:
            problems.append(f"env {var}={env[var]!r}: {err}")

    for suffix, key, parse in _OTLP_ENV:
        for var in (f"OTEL_EXPORTER_OTLP_{suffix}", f"OTEL_EXPORTER_OTLP_METRICS_{suffix}"):
            if var in env:
                put(var, key, parse, otlp, f"export.otlp.{key}")
    if "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT" not in env and "OTEL_EXPORTER_OTLP_ENDPOINT" in env:
        # The spec: the generic endpoint is a base URL; the metrics path is appended (HTTP).
        if otlp.get("protocol") == "http/protobuf":
            otlp["endpoint"] = str(otlp["endpoint"]).rstrip("/") + _HTTP_METRICS_PATH
    elif "endpoint" not in otlp and otlp.get("protocol") == "http/protobuf":
        otlp["endpoint"] = "http://localhost:4318" + _HTTP_METRICS_PATH
    if "OTEL_METRIC_EXPORT_INTERVAL" in env:
        put(
            "OTEL_METRIC_EXPORT_INTERVAL",
            "interval_seconds",
            _ms,
            otlp,
            "export.otlp.interval_seconds",
        )
    if "OTEL_METRICS_EXPORTER" in env:
        wanted = {s.strip() for s in env["OTEL_METRICS_EXPORTER"].split(",")}
        if not wanted <= {"otlp", "prometheus", "none"}:
            problems.append(
                f"env OTEL_METRICS_EXPORTER={env['OTEL_METRICS_EXPORTER']!r}: "
                "expected a list of otlp, prometheus, none"
            )
        for name in ("otlp", "prometheus"):
            if isinstance(export.setdefault(name, {}), dict):
                export[name]["enabled"] = name in wanted
                sources[f"export.{name}.enabled"] = "env OTEL_METRICS_EXPORTER"
    return problems


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except OSError as err:
        raise ConfigError([f"{path}: cannot read: {err.strerror or err}"]) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError([f"{where}: invalid YAML: {what}"]) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: expected a mapping of keys at the top level"])
    return raw


def _describe(err: dict[str, Any], path: str, sources: dict[str, str]) -> str:
    key = ".".join(str(p) for p in err["loc"])
    origin = sources.get(key, path)
    if err["type"] == "extra_forbidden":
        return f"{origin}: {key}: unknown key"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{origin}: {key}: {msg} (got {err['input']!r})"


def load(path: str, env: Mapping[str, str] | None = None) -> Config:
    """Read the YAML file at `path`, overlay the environment (default os.environ), validate."""
    env = os.environ if env is None else env
    raw = _read_yaml(path)
    sources: dict[str, str] = {}
    problems = _apply_env(raw, env, sources)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as err:
        problems += [_describe(e, path, sources) for e in err.errors(include_url=False)]
        raise ConfigError(problems) from None
    if problems:
        raise ConfigError(problems)
    if not cfg.node_name:
        cfg.node_name = env.get("K8S_NODE_NAME") or socket.gethostname()
    return cfg


def dump(cfg: Config) -> str:
    """The configuration as YAML, in the layout of config/kubenpu.yaml."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def check_config(path: str) -> int:
    """`kubenpu-agent --check-config`: print the effective config and return 0, or the problems
    (one line each, on stderr) and return 2."""
    try:
        cfg = load(path)
    except ConfigError as err:
        for problem in err.problems:
            print(problem, file=sys.stderr)
        return 2
    sys.stdout.write(dump(cfg))
    return 0
