"""Export the agent's metrics: OTLP push (gRPC or HTTP/protobuf) and Prometheus pull (/metrics).

Both read snapshots of kubenpu.metrics.Metrics (see there why the OTel SDK's instruments are not
used). OTLP uses the OTel SDK's data model and its OTLP exporters, with cumulative temporality;
/metrics is a prometheus_client collector. Names are the same on both paths: prometheus_name()
applies Prometheus' own OTLP translation to each metric's OTel name and unit.
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import Metric as PromMetric
from prometheus_client.registry import Collector

from kubenpu import __version__
from kubenpu.config import Config, OtlpConfig
from kubenpu.metrics import CRI_BOUNDS, Hist, Metrics, Point, Spec

log = logging.getLogger(__name__)

# The OTLP exporters log a warning per retry and an error per failure; the pusher logs one line
# per failed push instead, quoting the exporters' last message.
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp"
_PROM_UNITS = {"s": "seconds", "By": "bytes"}


class ExportError(Exception):
    """A one-line reason the exporters cannot start; the agent exits 2."""


class PortInUseError(ExportError):
    pass


def prometheus_name(spec: Spec) -> str:
    """The name Prometheus gives the metric (dots to underscores, unit suffix, _total)."""
    name = spec.name.replace(".", "_")
    unit = "" if spec.unit.startswith("{") else _PROM_UNITS.get(spec.unit, spec.unit)
    if unit and not name.endswith("_" + unit):
        name += "_" + unit
    return name + "_total" if spec.kind == "counter" else name


def build_resource(cfg: Config) -> Resource:
    """service.name=kubenpu, service.version, host.name, k8s.node.name; then OTEL_SERVICE_NAME
    and OTEL_RESOURCE_ATTRIBUTES override (OTEL_SERVICE_NAME wins for service.name)."""
    ours = {
        "service.name": "kubenpu",
        "service.version": __version__,
        "host.name": socket.gethostname(),
        "k8s.node.name": cfg.node_name,
    }
    return Resource.create({**ours, **OTELResourceDetector().detect().attributes})


# --- OTLP ---------------------------------------------------------------------------------


def _otlp_metric(spec: Spec, points: list[Point], now: int) -> Metric:
    cumulative = AggregationTemporality.CUMULATIVE
    if spec.kind == "histogram":
        data: Sum | Gauge | Histogram = Histogram(
            [_hist_point(p, now) for p in points], aggregation_temporality=cumulative
        )
    else:
        nums = [NumberDataPoint(p.attrs, p.start_ns, now, p.value) for p in points]
        data = (
            Sum(nums, aggregation_temporality=cumulative, is_monotonic=True)
            if spec.kind == "counter"
            else Gauge(nums)
        )
    return Metric(spec.name, spec.description, spec.unit, data)


def _hist_point(p: Point, now: int) -> HistogramDataPoint:
    h = p.value
    assert isinstance(h, Hist)
    low, high = (h.low, h.high) if h.count else (0.0, 0.0)
    return HistogramDataPoint(
        p.attrs, p.start_ns, now, h.count, h.total, list(h.buckets), list(CRI_BOUNDS), low, high
    )


def metrics_data(snapshot: list[tuple[Spec, list[Point]]], resource: Resource) -> MetricsData:
    now = time.time_ns()
    scope = InstrumentationScope("kubenpu", __version__)
    metrics = [_otlp_metric(spec, points, now) for spec, points in snapshot if points]
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(scope, metrics, "")], "")])


def _otlp_exporter(cfg: OtlpConfig) -> MetricExporter:
    """Every setting is passed explicitly, so the exporter reads no environment of its own for
    them: kubenpu.config already applied the OTEL_* variables with their precedence."""
    files = [cfg.certificate, cfg.client_key, cfg.client_certificate]
    if cfg.protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(
            endpoint=cfg.url(),
            certificate_file=cfg.certificate or None,
            client_key_file=cfg.client_key or None,
            client_certificate_file=cfg.client_certificate or None,
            headers=cfg.headers,
            timeout=cfg.timeout_seconds,
        )
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcExporter,
    )

    credentials = None
    if cfg.use_tls():
        ca, key, cert = (_read(f) for f in files)
        credentials = grpc.ssl_channel_credentials(ca, key, cert)
    return GrpcExporter(
        endpoint=cfg.url(),
        insecure=not cfg.use_tls(),
        credentials=credentials,
        headers=cfg.headers,
        timeout=cfg.timeout_seconds,
    )


def _read(path: str) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as err:
        raise ExportError(f"cannot read OTLP TLS file {path}: {err.strerror}") from None


class _LastMessage(logging.Handler):
    """Keeps the OTLP exporters' latest warning, to quote it in our single line per failure.
    Their loggers drop a repeat of the same message within 20 s, hence it is kept, not reset."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.text = record.getMessage().splitlines()[0]


class OtlpPusher:
    """Pushes a snapshot every interval. Nothing is queued: the counts are cumulative, so a
    failed push is simply superseded by the next one and memory stays bounded."""

    def __init__(self, cfg: OtlpConfig, metrics: Metrics, resource: Resource) -> None:
        self._cfg = cfg
        self._metrics = metrics
        self._resource = resource
        self._exporter = _otlp_exporter(cfg)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-push", daemon=True)
        self._failures = 0
        self._last = _LastMessage()
        exporter_log = logging.getLogger(_EXPORTER_LOGGER)
        exporter_log.addHandler(self._last)
        exporter_log.propagate = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._cfg.interval_seconds):
            self.push()

    def push(self) -> bool:
        data = metrics_data(self._metrics.collect(), self._resource)
        ok = self._exporter.export(data, timeout_millis=self._cfg.timeout_seconds * 1000)
        if ok is MetricExportResult.SUCCESS:
            if self._failures:
                log.info(
                    "OTLP export to %s recovered after %d failed pushes",
                    self._cfg.url(),
                    self._failures,
                )
            self._failures = 0
            return True
        self._failures += 1
        self._metrics.export_error()
        log.warning(
            "OTLP export to %s failed (%d in a row): %s; next try in %gs, counts are cumulative",
            self._cfg.url(),
            self._failures,
            self._last.text or "unknown error",
            self._cfg.interval_seconds,
        )
        return False

    def shutdown(self) -> None:
        """Stop the timer, push the final counts, close the connection."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.push()
        self._exporter.shutdown()
        exporter_log = logging.getLogger(_EXPORTER_LOGGER)
        exporter_log.removeHandler(self._last)
        exporter_log.propagate = True


# --- Prometheus ---------------------------------------------------------------------------


def _label_name(key: str) -> str:
    return key.replace(".", "_")


def _label_value(v: str | bool) -> str:
    return str(v).lower() if isinstance(v, bool) else v


class PrometheusCollector(Collector):
    """Renders Metrics snapshots for prometheus_client, plus target_info for the resource."""

    def __init__(self, metrics: Metrics, resource: Resource) -> None:
        self._metrics = metrics
        self._target = {_label_name(k): str(v) for k, v in resource.attributes.items()}

    def collect(self) -> Iterator[PromMetric]:
        info = PromMetric("target_info", "Target metadata (the OTel resource)", "gauge")
        info.add_sample("target_info", self._target, 1)
        yield info
        for spec, points in self._metrics.collect():
            yield self._family(spec, points)

    @staticmethod
    def _family(spec: Spec, points: list[Point]) -> PromMetric:
        name = prometheus_name(spec)
        fam = PromMetric(name.removesuffix("_total"), spec.description, spec.kind)
        for p in points:
            labels = {_label_name(k): _label_value(v) for k, v in p.attrs.items()}
            if isinstance(p.value, Hist):
                cumulative = 0
                for bound, n in zip((*CRI_BOUNDS, float("inf")), p.value.buckets, strict=True):
                    cumulative += n
                    le = "+Inf" if bound == float("inf") else repr(bound)
                    fam.add_sample(name + "_bucket", {**labels, "le": le}, cumulative)
                fam.add_sample(name + "_count", labels, p.value.count)
                fam.add_sample(name + "_sum", labels, p.value.total)
            else:
                fam.add_sample(name, labels, p.value)
        return fam


def serve_prometheus(
    metrics: Metrics, resource: Resource, host: str, port: int
) -> Callable[[], None]:
    """Serve /metrics on host:port; returns the function that stops the server."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrometheusCollector(metrics, resource))
    ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
    try:
        server, thread = start_http_server(port, host, registry)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"metrics port {host}:{port} is already in use (export.prometheus.port)"
            ) from None
        raise ExportError(f"cannot serve metrics on {host}:{port}: {err.strerror or err}") from None

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


# --- wiring -------------------------------------------------------------------------------


@dataclass
class Telemetry:
    metrics: Metrics
    resource: Resource
    pusher: OtlpPusher | None = None
    _stops: list[Callable[[], None]] = field(default_factory=list)

    def flush(self) -> bool:
        """Push now (OTLP); True if it was delivered or OTLP is off."""
        return self.pusher.push() if self.pusher else True

    def shutdown(self) -> None:
        """Final OTLP push, then stop serving /metrics."""
        if self.pusher:
            self.pusher.shutdown()
        for stop in self._stops:
            stop()


def start(cfg: Config, clock: Callable[[], float] = time.monotonic) -> Telemetry:
    """Create the Metrics state and start the enabled exporters. Raises ExportError."""
    metrics = Metrics(cfg.node_name, cfg.metrics.series_ttl_seconds, cfg.metrics.max_series, clock)
    tel = Telemetry(metrics, build_resource(cfg))
    prom = cfg.export.prometheus
    if prom.enabled:
        tel._stops.append(serve_prometheus(metrics, tel.resource, prom.host, prom.port))
    if cfg.export.otlp.enabled:
        try:
            tel.pusher = OtlpPusher(cfg.export.otlp, metrics, tel.resource)
        except ExportError:
            tel.shutdown()
            raise
        tel.pusher.start()
    return tel
