"""Export stage, OTLP push (gRPC or HTTP/protobuf): the OTel SDK's data model and its OTLP
exporters, with cumulative temporality. Imported only when export.otlp is enabled, so an agent
that is only scraped never loads the SDK's metrics modules and the exporters.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
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
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kubenpu import __version__
from kubenpu.config import OtlpConfig
from kubenpu.export.files import read_regular
from kubenpu.files import read_at_most
from kubenpu.kernel import abi
from kubenpu.metrics.catalogue import CRI_BOUNDS, K8S_ATTRIBUTES, SCHEMA_URL, Attrs, Spec
from kubenpu.metrics.own import EXPORT_FAILED
from kubenpu.metrics.points import ExpHist, Hist, Point
from kubenpu.metrics.series import Series

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)

# The OTLP exporters log a warning per retry and an error per failure; the pusher logs one line
# per failed push instead, quoting the exporters' last message.
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp"
# An OTLP/HTTP answer is an ExportMetricsServiceResponse (a partial success) or a Status: bytes.
MAX_ANSWER_BYTES = 1 << 20


_Snapshot = list[tuple[Spec, list[Point]]]
_INT64 = range(-(2**63), 2**63)

# Upper bounds of encoded sizes, so that a batch cut by them is never larger once encoded:
# a protobuf field costs its tag (1 byte) and, for strings and messages, a length (<= 4 bytes).
_ATTR_BYTES = 4 * 5  # KeyValue, its key, its AnyValue and the string: tag and length each
_NUMBER_BYTES = 3 * 9 + 5  # start, time, value (fixed 8 bytes each), the point's tag and length
_HIST_BYTES = (5 + 2 * len(CRI_BOUNDS) + 1) * 9 + 3 * 5  # fixed fields, packed bounds, buckets
_EXP_BYTES = (6 + abi.DURATION_SLOTS) * 9 + 4 * 5  # fixed fields, bucket counts, their messages
_METRIC_BYTES = 6 * 5  # the metric, its name, description, unit, data message, temporality
# resource and scope metrics, resource, scope, its name and version; the two schema URLs
_REQUEST_BYTES = 8 * 5 + 2 * (len(SCHEMA_URL) + 5)


def _wire(value: float) -> float:
    """OTLP's as_int is an int64: a larger int (a sum of clients' cycle counters) goes as a
    double, as Prometheus would hold it; float() raises only past 1e308 (the series table refuses
    such increments), caught by _send()."""
    return value if not isinstance(value, int) or value in _INT64 else float(value)


def otlp_names(snapshot: _Snapshot, attributes: str) -> _Snapshot:
    """The snapshot under its OTLP names (export.otlp.attributes). semconv: the pod labels by
    K8S_ATTRIBUTES, each spec's own labels by Spec.attributes, and an NPU's points of a hw.gpu.*
    metric under the spec's npu name; a pod label with no value (a host process, an
    unattributed call) is left off, as OTLP has an attribute nobody knows (an empty
    k8s.pod.name would name a pod ""; Prometheus reads an absent label as empty, so the
    Collector's remote write is unchanged). legacy keeps the names of the release before
    (namespace, pod, container, sensor, ...), empty ones too, and leaves pod_uid out, so a
    pipeline built on them gets the series it got before."""
    if attributes == "legacy":
        return [(spec, _legacy(points)) for spec, points in snapshot]
    named: _Snapshot = []
    for spec, points in snapshot:
        names = {**K8S_ATTRIBUTES, **dict(spec.attributes)}
        renamed = [
            p._replace(
                attrs={
                    names.get(k, k): v
                    for k, v in p.attrs.items()
                    if v != "" or k not in K8S_ATTRIBUTES
                }
            )
            for p in points
        ]
        named += _by_device_type(spec, renamed)
    return named


def _by_device_type(spec: Spec, points: list[Point]) -> list[tuple[Spec, list[Point]]]:
    npu = [p for p in points if p.attrs.get("hw.type") == "npu"] if spec.npu else []
    if not npu:
        return [(spec, points)]
    gpu = [p for p in points if p.attrs.get("hw.type") != "npu"]
    return [(spec, gpu), (replace(spec, name=spec.npu, npu=""), npu)]


def _legacy(points: list[Point]) -> list[Point]:
    """The points without pod_uid. Two pods of one name (one after the other) are one series
    again, as before the uid: their values are summed (the CRI histogram has no pod labels; the
    call durations' sum bucket by bucket), from the earlier start."""
    merged: dict[frozenset[tuple[str, object]], Point] = {}
    for p in points:
        attrs: Attrs = {k: v for k, v in p.attrs.items() if k != "pod_uid"}
        key = frozenset(attrs.items())
        had = merged.get(key)
        if had is None or isinstance(p.value, Hist) or isinstance(had.value, Hist):
            merged[key] = Point(attrs, p.value, p.start_ns)
        else:
            merged[key] = Point(attrs, had.value + p.value, min(had.start_ns, p.start_ns))
    return list(merged.values())


def _attrs_bytes(attrs: Mapping[str, object]) -> int:
    return sum(len(k.encode()) + len(str(v).encode()) + _ATTR_BYTES for k, v in attrs.items())


def _point_bytes(spec: Spec, point: Point) -> int:
    if isinstance(point.value, ExpHist):
        fixed = _EXP_BYTES
    else:
        fixed = _HIST_BYTES if spec.kind == "histogram" else _NUMBER_BYTES
    return fixed + _attrs_bytes(point.attrs)


def batches(snapshot: _Snapshot, resource: Resource, max_bytes: int) -> Iterable[_Snapshot]:
    """The snapshot in batches whose requests encode to at most max_bytes each (a single point
    larger than that goes alone)."""
    base = _REQUEST_BYTES + _attrs_bytes(resource.attributes) + len(__version__) + 16
    batch: _Snapshot = []
    size = base
    for spec, points in snapshot:
        head = _METRIC_BYTES + len(spec.name) + len(spec.description.encode()) + len(spec.unit)
        part: list[Point] | None = None
        for point in points:
            need = _point_bytes(spec, point) + (head if part is None else 0)
            if batch and size + need > max_bytes:
                yield batch
                batch, size, part = [], base, None
                need = _point_bytes(spec, point) + head
            if part is None:
                part = []
                batch.append((spec, part))
            part.append(point)
            size += need
    if batch:
        yield batch


def _otlp_metric(spec: Spec, points: list[Point], now: int) -> Metric:
    cumulative = AggregationTemporality.CUMULATIVE
    if points and isinstance(points[0].value, ExpHist):
        data: Sum | Gauge | Histogram | ExponentialHistogram = ExponentialHistogram(
            [_exp_point(p, now) for p in points], aggregation_temporality=cumulative
        )
    elif spec.kind == "histogram":
        data = Histogram([_hist_point(p, now) for p in points], aggregation_temporality=cumulative)
    else:
        number = round if spec.integer else _wire  # int64 values: memory sizes in bytes
        nums = [NumberDataPoint(p.attrs, p.start_ns, now, number(p.value)) for p in points]
        data = (
            Sum(nums, aggregation_temporality=cumulative, is_monotonic=spec.kind == "counter")
            if spec.kind in ("counter", "updowncounter")
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


def _exp_point(p: Point, now: int) -> ExponentialHistogramDataPoint:
    """The kernel's buckets as they are (docs/latency.md): at scale abi.SCALE from index
    abi.FIRST_INDEX; the calls of at most 2^-20 s as the zero bucket, and those over 64 s in
    the bucket above 64 s. The kernel keeps no extremes: min and max are the bounds of the
    lowest and highest buckets that hold a call."""
    h = p.value
    assert isinstance(h, ExpHist)
    held = [i for i, n in enumerate(h.slots) if n]
    low = 0.0 if not held or held[0] == 0 else 2 ** ((held[0] - 1 + abi.FIRST_INDEX) / 4)
    high = 0.0 if not held else 2 ** ((max(held[-1], 1) + abi.FIRST_INDEX) / 4)
    return ExponentialHistogramDataPoint(
        p.attrs,
        p.start_ns,
        now,
        h.count,
        h.total,
        abi.SCALE,
        h.slots[0],
        Buckets(abi.FIRST_INDEX, list(h.slots[1:])),
        Buckets(0, []),
        0,
        low,
        high,
    )


def metrics_data(snapshot: _Snapshot, resource: Resource) -> MetricsData:
    """One request's data; the scope's schema_url is the resource's (SCHEMA_URL when the names
    are semconv's, none for legacy names)."""
    now = time.time_ns()
    schema_url = resource.schema_url
    scope = InstrumentationScope("kubenpu", __version__, schema_url)
    metrics = [_otlp_metric(spec, points, now) for spec, points in snapshot if points]
    scoped = [ScopeMetrics(scope, metrics, schema_url)]
    return MetricsData([ResourceMetrics(resource, scoped, schema_url)])


# Passed always: with None the exporter would read OTEL_EXPORTER_OTLP_COMPRESSION itself.
_GRPC_COMPRESSION = {"none": grpc.Compression.NoCompression, "gzip": grpc.Compression.Gzip}


def _otlp_exporter(cfg: OtlpConfig) -> MetricExporter:
    """Every setting is passed explicitly, so the exporter reads no environment of its own for
    them: kubenpu.config already applied the OTEL_* variables with their precedence."""
    # Each a regular file, or the start fails (--check-config reads them the same way).
    contents = [
        read_regular(path, f"export.otlp.{key}") if path else None
        for key, path in (
            ("certificate", cfg.certificate),
            ("client_key", cfg.client_key),
            ("client_certificate", cfg.client_certificate),
        )
    ]
    if cfg.protocol == "http/protobuf":  # its exporter opens them again, by path
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(
            endpoint=cfg.url(),
            compression=Compression(cfg.compression),
            certificate_file=cfg.certificate or None,
            client_key_file=cfg.client_key or None,
            client_certificate_file=cfg.client_certificate or None,
            headers=cfg.headers,
            timeout=cfg.timeout_seconds,
            session=_session(configured_ca=bool(cfg.certificate)),
        )
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcExporter,
    )

    credentials = None
    if cfg.use_tls():
        ca, key, cert = contents
        credentials = grpc.ssl_channel_credentials(ca, key, cert)
    return GrpcExporter(
        endpoint=cfg.url(),
        compression=_GRPC_COMPRESSION[cfg.compression],
        insecure=not cfg.use_tls(),
        credentials=credentials,
        headers=cfg.headers,
        timeout=cfg.timeout_seconds,
    )


def _session(configured_ca: bool) -> requests.Session:
    """A requests session that reads at most MAX_ANSWER_BYTES of an answer, inflated (a plain
    one reads and inflates the whole body: a collector's gzip answer of 1 MB made 1 GB of
    memory), and, with `configured_ca`, verifies with the CA it is given. A plain one takes
    REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE from the environment over that (psf/requests#3829,
    #4726), so a node image that sets one would make export.otlp.certificate be ignored and
    every HTTP push fail verification. requests comes with the HTTP exporter, so it is
    imported here, not for a gRPC push."""
    import requests

    class Bounded(requests.Session):
        def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
            response = super().send(request, **{**kwargs, "stream": True})
            read = partial(response.raw.read, decode_content=True)
            try:  # an answer past the bound fails the push (the exporter quotes why)
                response._content = read_at_most(read, MAX_ANSWER_BYTES, "the collector's answer")
            finally:
                response.close()  # an unread rest closes the connection
            return response

    class ConfiguredCA(Bounded):
        def merge_environment_settings(self, *args: Any) -> dict[str, Any]:
            return {**super().merge_environment_settings(*args), "verify": self.verify}

    return ConfiguredCA() if configured_ca else Bounded()


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

    def __init__(self, cfg: OtlpConfig, metrics: Series, resource: Resource) -> None:
        self._cfg = cfg
        self._metrics = metrics
        # The encoder takes schema_url from the resource (and metrics_data the scope's).
        schema_url = SCHEMA_URL if cfg.attributes == "semconv" else ""
        self._resource = Resource(resource.attributes, schema_url)
        self._exporter = _otlp_exporter(cfg)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-push", daemon=True)
        self._failures = 0
        self._final = False
        self._last = _LastMessage()
        exporter_log = logging.getLogger(_EXPORTER_LOGGER)
        exporter_log.addHandler(self._last)
        exporter_log.propagate = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._cfg.interval_seconds):
            self.push()
        self._final = self.push()  # after stop: the counts as the agent left them

    def push(self) -> bool:
        """One snapshot, in requests of at most max_request_bytes, within one timeout."""
        try:
            reason = self._send(otlp_names(self._metrics.collect(), self._cfg.attributes))
        except Exception as err:  # e.g. a value the encoder refuses: this push fails, not the next
            reason = f"cannot encode the push: {type(err).__name__}: {err}"
        if reason is None:
            if self._failures:
                log.info(
                    "OTLP export to %s recovered after %d failed pushes",
                    self._cfg.url(),
                    self._failures,
                )
            self._failures = 0
            return True
        self._failures += 1
        self._metrics.set(EXPORT_FAILED, "", 1)
        log.warning(
            "OTLP export to %s failed (%d in a row): %s; next try in %gs, counts are cumulative",
            self._cfg.url(),
            self._failures,
            reason,
            self._cfg.interval_seconds,
        )
        return False

    def _send(self, snapshot: _Snapshot) -> str | None:
        """Export the snapshot's batches; why not, at the first the receiver refuses (the rest
        would most likely fail alike, each costing a timeout). A batch that cannot be encoded
        fails the push, but the other batches still go out."""
        deadline = time.monotonic() + self._cfg.timeout_seconds
        failed = None
        for batch in batches(snapshot, self._resource, self._cfg.max_request_bytes):
            left = deadline - time.monotonic()
            if left <= 0:
                return f"the push took longer than {self._cfg.timeout_seconds}s"
            try:
                data = metrics_data(batch, self._resource)
            except Exception as err:  # a value the encoder refuses: this batch, not the push
                failed = failed or f"cannot encode the push: {type(err).__name__}: {err}"
                continue
            result = self._exporter.export(data, timeout_millis=left * 1000)
            if result is not MetricExportResult.SUCCESS:
                return self._last.text or "unknown error"
        return failed

    def shutdown(self) -> bool:
        """Push the final counts within one OTLP timeout, close the connection; True if they
        were delivered. The push thread makes the final push after any push in progress; if the
        two do not finish within the timeout (a blackholed collector), the push is abandoned:
        closing the exporter cancels it, and the loss is logged, not waited for."""
        self._stop.set()
        self._thread.join(self._cfg.timeout_seconds)
        delivered = not self._thread.is_alive() and self._final
        if not delivered:
            log.warning(
                "OTLP export to %s: the final counts were not delivered within %gs "
                "(export.otlp.timeout_seconds); the collector keeps the last pushed counts",
                self._cfg.url(),
                self._cfg.timeout_seconds,
            )
        self._exporter.shutdown()
        exporter_log = logging.getLogger(_EXPORTER_LOGGER)
        exporter_log.removeHandler(self._last)
        exporter_log.propagate = True
        return delivered
