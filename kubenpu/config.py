"""The agent's YAML configuration, merged with the standard OTEL_* environment variables.

Precedence, highest first: OTEL_EXPORTER_OTLP_METRICS_* (signal-specific), OTEL_EXPORTER_OTLP_*
(generic), OTEL_METRIC_EXPORT_INTERVAL and OTEL_METRICS_EXPORTER, then the YAML file, then the
defaults below. This follows the OpenTelemetry specification, where the environment configures an
SDK. `node_name` is the exception: a non-empty YAML value wins over K8S_NODE_NAME.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Literal
from urllib.parse import unquote, urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from kubenpu.kernel.hooks import DEFAULT_HOOK
from kubenpu.resolve import DEFAULT_ENDPOINT
from kubenpu.resolve.podresources import DEFAULT_SOCKET

# The agent uses no pydantic plugins. Without this, defining the models below makes pydantic read
# every installed distribution's entry points (importlib.metadata) to look for plugins, a scan of
# the packages that costs a start under TCG as much as kubenpu/__init__.py says.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

_HTTP_METRICS_PATH = "/v1/metrics"
# Bounds on the input itself: a config is a few KiB, and a value echoed in an error is cut short,
# so no input (an alias bomb, a huge key) can make the error output or the memory unbounded.
MAX_FILE_BYTES = 1 << 20
MAX_YAML_NODES = 10_000
MAX_ECHO = 80
REDACTED = "<redacted>"

# Every duration and size has an upper bound: inf, 1e20 or a typo in the unit must be an error
# here, not an OverflowError in a worker thread or a timeout that can never fire.
DAY = 86_400.0
_Str = Annotated[str, Field(max_length=4096)]


class _Model(BaseModel):
    # strict: a YAML string "8080" is a mistake worth reporting, not something to coerce.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# The ring buffer's sizes: a power of two (the kernel's rule for BPF_MAP_TYPE_RINGBUF), as a list
# so that JSON Schema (the chart's values.schema.json) can state the rule too.
RINGBUF_PAGES = [1 << n for n in range(17)]


class ProbeConfig(_Model):
    mode: Literal["aggregate", "events"] = "aggregate"
    hook: Literal["drm_ioctl", "security_file_ioctl"] = DEFAULT_HOOK
    attach: Literal["auto", "fentry", "kprobe"] = "auto"
    # core: the compiled-once CO-RE object; bcc: compile on the node (needs kernel headers);
    # auto: core, and bcc when the kernel refuses the object (docs/core.md)
    loader: Literal["auto", "core", "bcc"] = "auto"
    ringbuf_pages: int = Field(
        256, gt=0, le=RINGBUF_PAGES[-1], json_schema_extra={"enum": RINGBUF_PAGES}
    )
    # time counted calls and count their errors (CO-RE, aggregate mode; docs/latency.md)
    durations: bool = True
    # where a timed call ends: drm_ioctl (passed by DRM calls alone; on drm.ko it needs
    # CAP_SYS_ADMIN, else calls are counted untimed) or syscall (the ioctl syscall's return:
    # every ioctl of the node pays an exit; docs/performance.md)
    durations_exit: Literal["drm_ioctl", "syscall"] = "drm_ioctl"
    # GPU jobs' queue and run times per pod from the DRM GPU scheduler (docs/jobs.md)
    jobs: bool = True
    queue_size: int = Field(65536, gt=0, le=16_777_216)
    pin_dir: _Str = ""  # bpffs directory to pin the probe in (docs/pinning.md); "" = off

    @field_validator("ringbuf_pages")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v not in RINGBUF_PAGES:  # within the bounds above: not a power of two
            raise ValueError("must be a power of two")
        return v


class DiscoveryConfig(_Model):
    root: _Str = "/"
    ignore_devices: list[_Str] = Field([], max_length=4096)


class CriConfig(_Model):
    endpoint: _Str = DEFAULT_ENDPOINT
    timeout_seconds: float = Field(2, gt=0, le=60)
    retry_after_seconds: float = Field(30, ge=0, le=DAY)
    concurrency: int = Field(4, ge=1, le=64)


# Validators check these patterns, and the models give them to JSON Schema (the chart's values
# schema) too: an absolute socket path, `unix://` optional; an http(s) URL with a host, the
# scheme case-blind and leading spaces skipped as urlsplit does.
_ABSOLUTE_SOCKET = re.compile(r"^(unix://)?/")
_HTTP_URL = re.compile(r"^ *[hH][tT][tT][pP][sS]?://[^/?#]")


class PodResourcesConfig(_Model):
    """The kubelet's PodResources API: which pods were allocated which devices."""

    enabled: bool = False
    socket: _Str = Field(DEFAULT_SOCKET, json_schema_extra={"pattern": _ABSOLUTE_SOCKET.pattern})
    interval_seconds: float = Field(10, gt=0, le=3600)
    timeout_seconds: float = Field(5, gt=0, le=60)

    @field_validator("socket")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not _ABSOLUTE_SOCKET.match(v):
            raise ValueError(f"{short(v)} is not an absolute socket path")
        return v


class AttributionConfig(_Model):
    cgroup_root: _Str = "/sys/fs/cgroup"
    pending_seconds: float = Field(120, ge=0, le=DAY)
    cri: CriConfig = CriConfig()
    pod_resources: PodResourcesConfig = PodResourcesConfig()


class MetricsConfig(_Model):
    series_ttl_seconds: float = Field(300, ge=0, le=30 * DAY)
    max_series: int = Field(10000, gt=0, le=1_000_000)
    # Blocked-by pairs (waiting pod, pod it waited behind) per GPU ring; past it, behind_pod is
    # "other" (docs/jobs.md#who-is-in-my-way).
    max_behind_pairs: int = Field(16, gt=0, le=1024)


def _both_or_neither(a: tuple[str, str], b: tuple[str, str]) -> None:
    if bool(a[1]) != bool(b[1]):
        raise ValueError(f"{a[0]} and {b[0]} go together: set both or neither")


class TlsConfig(_Model):
    cert_file: _Str = ""
    key_file: _Str = ""

    @model_validator(mode="after")
    def _pair(self) -> TlsConfig:
        _both_or_neither(("cert_file", self.cert_file), ("key_file", self.key_file))
        return self

    def enabled(self) -> bool:
        return bool(self.cert_file)


class AuthConfig(_Model):
    """Basic and/or bearer auth for /metrics; secrets are read from files, never from here."""

    username: _Str = ""
    password_file: _Str = ""
    bearer_token_file: _Str = ""

    @model_validator(mode="after")
    def _pair(self) -> AuthConfig:
        _both_or_neither(("username", self.username), ("password_file", self.password_file))
        return self


class FdinfoConfig(_Model):
    enabled: bool = True
    interval_seconds: float = Field(5, gt=0, le=3600)


class TelemetryConfig(_Model):
    enabled: bool = True  # device power, energy, clocks from sysfs/hwmon, on the fdinfo interval
    # Each device's sysfs/hwmon read must finish within this, or the device is marked stale.
    deadline_seconds: float = Field(1, gt=0, le=60)
    # DRM wedged and devcoredump uevents (kubenpu.sources.wedges): resets, coredumps, hw.status
    # failed.
    uevents: bool = True


class PrometheusConfig(_Model):
    enabled: bool = True
    host: _Str = "0.0.0.0"
    port: int = Field(8080, ge=1, le=65535)
    max_connections: int = Field(64, ge=1, le=4096)
    read_timeout_seconds: float = Field(10, gt=0, le=300)
    tls: TlsConfig = TlsConfig()
    auth: AuthConfig = AuthConfig()


class OtlpConfig(_Model):
    enabled: bool = False
    # The pod attributes' names: semconv = k8s.namespace.name, k8s.pod.name, k8s.pod.uid,
    # k8s.container.name (metrics.catalogue.K8S_ATTRIBUTES); legacy = namespace, pod, container
    # (the names before k8s.*), for pipelines built on them; kept for one release.
    attributes: Literal["semconv", "legacy"] = "semconv"
    endpoint: _Str = Field(
        "http://localhost:4317", json_schema_extra={"pattern": _HTTP_URL.pattern}
    )
    protocol: Literal["grpc", "http/protobuf"] = "grpc"
    headers: dict[str, str] = Field({}, max_length=64)
    insecure: bool | None = None
    certificate: _Str = ""
    client_certificate: _Str = ""
    client_key: _Str = ""
    interval_seconds: float = Field(15, gt=0, le=DAY)
    timeout_seconds: float = Field(10, gt=0, le=300)
    # gzip: a node's push of 100 pods is 381 KB, 20 KB gzipped (docs/performance.md).
    compression: Literal["none", "gzip"] = "none"
    # A receiver's default limit is 4 MiB (gRPC's max message size): a push is split into
    # requests of at most this many bytes.
    max_request_bytes: int = Field(2 << 20, ge=64 << 10, le=64 << 20)

    @field_validator("headers")
    @classmethod
    def _metadata(cls, v: dict[str, str]) -> dict[str, str]:
        return {_header_key(k): _header_value(k, val) for k, val in v.items()}

    @field_validator("endpoint")
    @classmethod
    def _url(cls, v: str) -> str:
        # urlsplit drops CR, LF and tab silently: a header injection the HTTP exporter then sent.
        if any(c < " " or c == "\x7f" for c in v):
            raise ValueError(f"{short(v)} holds a control character")
        if not _HTTP_URL.match(v):
            raise ValueError(f"{short(v)} is not an http:// or https:// URL")
        urlsplit(v)  # what it cannot split (an unclosed IPv6 literal) fails here, not in url()
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


# gRPC metadata keys are lowercase (the OTel SDK lowercases header keys: a capitalised key makes
# grpcio refuse every call with "Invalid metadata"); values are printable ASCII.
_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")
_METADATA_VALUE = re.compile(r"[\x20-\x7e]*")


def _header_key(key: str) -> str:
    key = key.strip().lower()
    if not _METADATA_KEY.fullmatch(key) or key.startswith("grpc-") or len(key) > 256:
        raise ValueError(f"header {short(key)} is not a valid header name (<= 256 characters)")
    return key


def _header_value(key: str, value: str) -> str:
    value = value.strip()
    if not _METADATA_VALUE.fullmatch(value) or len(value) > 8192:
        raise ValueError(f"the value of header {short(key)} is not printable ASCII (<= 8 KiB)")
    return value


def short(value: object) -> str:
    """repr() of a value, cut to MAX_ECHO characters: what an error line may echo."""
    text = repr(value)
    return text if len(text) <= MAX_ECHO else text[: MAX_ECHO - 3] + "..."


class ExportConfig(_Model):
    prometheus: PrometheusConfig = PrometheusConfig()
    otlp: OtlpConfig = OtlpConfig()


GuardMode = Literal["off", "audit", "enforce"]


# A pod label or annotation key (a DNS subdomain prefix, a slash, a name of 63) and a label's
# value: Kubernetes' own limits, so a rule no pod could match is an error here.
_LabelKey = Annotated[str, Field(min_length=1, max_length=253 + 1 + 63)]
_LabelValue = Annotated[str, Field(max_length=63)]
MAX_RULE_KEYS = 64


class GuardRule(_Model):
    """An allow rule (docs/guard.md): pods of `namespace` may use `device` (a device id as the
    agent logs it, e.g. 0000:03:00.0); "*" matches any. With `labels` or `annotations`, only the
    pods that carry every one of them with that value (as the runtime's pod sandbox has them:
    the pod's at its creation)."""

    namespace: _Str = "*"
    device: _Str = "*"
    labels: dict[_LabelKey, _LabelValue] = Field({}, max_length=MAX_RULE_KEYS)
    annotations: dict[_LabelKey, _Str] = Field({}, max_length=MAX_RULE_KEYS)


class GuardConfig(_Model):
    """The access guard (docs/guard.md): BPF LSM programs that allow or block a pod's getting an
    fd of the devices a plugin manages (open, receipt over a unix socket or pidfd_getfd), and
    with `ioctl` each ioctl on one. Needs attribution.pod_resources (the allocations)."""

    mode: GuardMode = "off"
    namespaces: dict[_Str, GuardMode] = Field({}, max_length=4096)  # namespace -> its own mode
    allow: list[GuardRule] = Field([], max_length=4096)
    # Also check every ioctl of a guarded device: stops an fd a pod held before the guard or its
    # policy reached the kernel, or carried into a pod cgroup, at the cost of an LSM program on
    # every ioctl of every process on the node (docs/guard.md, docs/performance.md).
    ioctl: bool = False
    # The policy is rewritten this often, and at once on a pod cgroup's birth.
    refresh_seconds: float = Field(10, gt=0, le=3600)
    heartbeat_seconds: float = Field(1, gt=0, le=60)
    # With no heartbeat for this long (the agent stalled) the guard lets every access through.
    fail_open_seconds: float = Field(30, gt=0, le=3600)

    @model_validator(mode="after")
    def _beats_within(self) -> GuardConfig:
        if self.heartbeat_seconds * 2 > self.fail_open_seconds:
            raise ValueError(
                "guard.fail_open_seconds must be at least twice guard.heartbeat_seconds: a late "
                "beat would fail the guard open"
            )
        return self

    def on(self) -> bool:
        """Whether any pod can be guarded: the mode or a namespace's is not off."""
        return any(m != "off" for m in (self.mode, *self.namespaces.values()))


class PlacementConfig(_Model):
    # The opt-in sched_ext scheduler that runs the tasks of each pod using a device on CPUs of
    # the device's NUMA node (docs/scheduler.md); needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN)
    # and CAP_SYS_NICE.
    scheduler: bool = False


NODE_NAME_MAX = 253  # a Kubernetes node name is a DNS subdomain


class Config(_Model):
    node_name: str = Field("", max_length=NODE_NAME_MAX)
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    probe: ProbeConfig = ProbeConfig()
    discovery: DiscoveryConfig = DiscoveryConfig()
    attribution: AttributionConfig = AttributionConfig()
    metrics: MetricsConfig = MetricsConfig()
    fdinfo: FdinfoConfig = FdinfoConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    export: ExportConfig = ExportConfig()
    guard: GuardConfig = GuardConfig()
    placement: PlacementConfig = PlacementConfig()

    @model_validator(mode="after")
    def _guard_allocations(self) -> Config:
        if self.guard.on() and not self.attribution.pod_resources.enabled:
            raise ValueError(
                "guard: a mode other than off needs attribution.pod_resources.enabled (the "
                "allocations the policy is made of)"
            )
        return self


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


def _pairs(v: str) -> dict[str, str]:
    """The OTel `key=value,key2=value2` list (headers, resource attributes), percent-decoded.
    An error names the key only: values may be secrets."""
    out = {}
    for item in filter(None, (s.strip() for s in v.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{short(key.strip())} is not key=value")
        out[unquote(key.strip())] = unquote(value.strip())
    return out


def _headers(v: str) -> dict[str, str]:
    return {_header_key(k): _header_value(k, val) for k, val in _pairs(v).items()}


_OTLP_ENV = (
    ("PROTOCOL", "protocol", str),
    ("ENDPOINT", "endpoint", str),
    ("HEADERS", "headers", _headers),
    ("INSECURE", "insecure", _bool),
    ("CERTIFICATE", "certificate", str),
    ("CLIENT_CERTIFICATE", "client_certificate", str),
    ("CLIENT_KEY", "client_key", str),
    ("TIMEOUT", "timeout_seconds", _ms),
    ("COMPRESSION", "compression", str),
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
            problems.append(f"{_env_origin(var, env[var])}: {err}")

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
                f"{_env_origin('OTEL_METRICS_EXPORTER', env['OTEL_METRICS_EXPORTER'])}: "
                "expected a list of otlp, prometheus, none"
            )
        for name in ("otlp", "prometheus"):
            if isinstance(export.setdefault(name, {}), dict):
                export[name]["enabled"] = name in wanted
                sources[f"export.{name}.enabled"] = "env OTEL_METRICS_EXPORTER"
    if "OTEL_RESOURCE_ATTRIBUTES" in env:
        # Read by the OTel SDK's resource detector, which skips a malformed list silently.
        try:
            _pairs(env["OTEL_RESOURCE_ATTRIBUTES"])
        except ValueError as err:
            problems.append(f"env OTEL_RESOURCE_ATTRIBUTES: {err}")
    return problems


def _env_origin(var: str, value: str) -> str:
    """How an error line names a variable: its value (cut short), unless it may hold secrets."""
    return f"env {var}" if var.endswith("HEADERS") else f"env {var}={short(value)}"


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """Nodes in the document once aliases are expanded (memoised: aliases share node objects)."""
    if id(node) not in sizes:
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        sizes[id(node)] = 1 + sum(_expanded_size(c, sizes) for c in children)
    return sizes[id(node)]


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently, so a second `export:` would quietly replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:  # before merge keys (<<) are flattened: those may override
            if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
                continue
            if (first := seen.get((key.tag, key.value))) is not None:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key {key.value[:40]!r} (first on line {first})",
                    problem_mark=key.start_mark,
                )
            seen[key.tag, key.value] = key.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _parse_yaml(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_YAML_NODES:
            raise yaml.YAMLError(f"more than {MAX_YAML_NODES} values once aliases are expanded")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ConfigError([f"{path}: cannot read: {err.strerror or err}"]) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError([f"{path}: larger than {MAX_FILE_BYTES} bytes"])
    try:
        raw = _parse_yaml(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError([f"{path}: not UTF-8 text (byte {err.start})"]) from None
    except (yaml.YAMLError, RecursionError) as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        what = getattr(err, "problem", None) or (str(err).splitlines() or ["too deep"])[0]
        raise ConfigError([f"{where}: invalid YAML: {what[:MAX_ECHO]}"]) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError([f"{path}: expected a mapping of keys at the top level"])
    return raw


# pydantic's messages for these name the model class ("a valid dictionary or instance of
# ProbeConfig"), which an operator never wrote; the key is already in the line.
_MESSAGES = {
    "model_type": "expected a mapping of keys (an empty section is {})",
    "model_attributes_type": "expected a mapping of keys (an empty section is {})",
    "dict_type": "expected a mapping of keys (an empty one is {})",
}


def _describe(err: dict[str, Any], path: str, sources: dict[str, str]) -> str:
    key = ".".join(str(p)[:MAX_ECHO] for p in err["loc"])
    origin = sources.get(key, path)
    if err["type"] == "extra_forbidden":
        return f"{origin}: {key}: unknown key"
    msg = _MESSAGES.get(err["type"], err["msg"].removeprefix("Value error, "))[:MAX_ECHO]
    if key.startswith("export.otlp.headers"):
        return f"{origin}: {key}: {msg}"  # the input holds secrets
    return f"{origin}: {key}: {msg} (got {short(err['input'])})"


DEFAULT_PATH = "/etc/kubenpu/config.yaml"
NO_FILE = "(no config file)"  # where an error line says a value came from, without a file
# Checks of what the config names (the files the exporters read): problems, one line each.
Checks = Callable[[Config], list[str]]


def path_to_load(given: str) -> str | None:
    """The file `--config` names (DEFAULT_PATH unless given); None when that is DEFAULT_PATH
    and nothing is there: every key has a default, so no file is needed."""
    if given == DEFAULT_PATH and not os.path.lexists(DEFAULT_PATH):
        return None
    return given


def load(
    path: str | None, env: Mapping[str, str] | None = None, checks: Checks = lambda _: []
) -> Config:
    """Read the YAML file at `path` (None: no file, the defaults), overlay the environment
    (default os.environ), validate, then run `checks` on the result: what they find fails the
    load as a bad value does, so --check-config and the start report the same lines."""
    env = os.environ if env is None else env
    raw = {} if path is None else _read_yaml(path)
    sources: dict[str, str] = {}
    problems = _apply_env(raw, env, sources)
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as err:
        problems += [_describe(e, path or NO_FILE, sources) for e in err.errors(include_url=False)]
        raise ConfigError(problems) from None
    if problems:
        raise ConfigError(problems)
    if not cfg.node_name:
        cfg.node_name = env.get("K8S_NODE_NAME") or socket.gethostname()
        if len(cfg.node_name) > NODE_NAME_MAX:
            raise ConfigError([f"K8S_NODE_NAME: longer than {NODE_NAME_MAX} characters"])
    if problems := checks(cfg):
        raise ConfigError(problems)
    return cfg


def _redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(
        netloc=f"{parts.username}:{REDACTED}@{parts.netloc.rpartition('@')[2]}"
    ).geturl()


def dump(cfg: Config) -> str:
    """The configuration as YAML, in the layout of config/kubenpu.yaml, with secrets (header
    values, a password in the endpoint URL) replaced by <redacted>."""
    raw = cfg.model_dump(mode="json")
    otlp = raw["export"]["otlp"]
    otlp["headers"] = dict.fromkeys(otlp["headers"], REDACTED)
    otlp["endpoint"] = _redact_url(otlp["endpoint"])
    return yaml.safe_dump(raw, sort_keys=False)


def check_config(
    path: str,
    warnings: Callable[[Config], Iterable[str]] = lambda _: (),
    checks: Checks = lambda _: [],
) -> int:
    """`kubenpu-agent --check-config`: print the effective config and return 0, or the problems
    (one line each, on stderr) and return 2. `checks` are the start's (see load()); `warnings`
    (e.g. an expired certificate) go to stderr, one line each, and do not fail the check."""
    try:
        cfg = load(path, checks=checks)
    except ConfigError as err:
        for problem in err.problems:
            print(problem, file=sys.stderr)
        return 2
    for warning in warnings(cfg):
        print(f"warning: {warning}", file=sys.stderr)
    sys.stdout.write(dump(cfg))
    return 0
