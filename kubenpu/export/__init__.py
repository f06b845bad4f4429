"""Export the agent's metrics: OTLP push (gRPC or HTTP/protobuf) and Prometheus pull (/metrics).

Both read snapshots of the series table, kubenpu.metrics.series (see there why the OTel SDK's
instruments are not used). The modules: `otlp` (imported only when OTLP is enabled: the OTel
SDK's data model and its OTLP exporters, with cumulative temporality), `prometheus` (imported
only when Prometheus export is enabled: a prometheus_client collector), `server` (the socket
that serves /metrics, /healthz and /readyz) and `errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.sdk.resources import OTELResourceDetector, Resource

from kubenpu import __version__
from kubenpu.config import Config
from kubenpu.export import certs, files, tls
from kubenpu.export.errors import ExportError, PortInUseError
from kubenpu.export.server import HealthChecks, MetricsServer
from kubenpu.metrics.own import CERTIFICATES, EXHAUSTED
from kubenpu.metrics.series import Series

if TYPE_CHECKING:
    from kubenpu.export.otlp import OtlpPusher
    from kubenpu.export.prometheus import MetricsApp

__all__ = [
    "ExportError",
    "Exporters",
    "PortInUseError",
    "build_resource",
    "certs",
    "check",
    "start",
]


def build_resource(cfg: Config) -> Resource:
    """service.name=kubenpu, service.version, service.instance.id (the node: one agent a
    node), host.name, k8s.node.name; then OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
    override (OTEL_SERVICE_NAME wins for service.name). A Prometheus-compatible store names a
    pushed series' instance by service.instance.id and keeps other resource attributes apart
    (target_info): without it, every node's series of one pod name would be one series.
    host.name is the node's name too: in a pod without the host's network, gethostname() is
    the pod's name, not the host's (config.load falls back to it only outside Kubernetes)."""
    ours = {
        "service.name": "kubenpu",
        "service.version": __version__,
        "service.instance.id": cfg.node_name,
        "host.name": cfg.node_name,
        "k8s.node.name": cfg.node_name,
    }
    return Resource.create({**ours, **OTELResourceDetector().detect().attributes})


@dataclass
class Exporters:
    """The running exporters: the metrics server and, when enabled, the OTLP pusher."""

    metrics: Series
    resource: Resource
    pusher: OtlpPusher | None = None
    server: MetricsServer | None = None

    def shutdown(self) -> bool:
        """Final OTLP push (bounded by the OTLP timeout), then stop serving. False if the final
        counts were not delivered (the pusher has logged it)."""
        delivered = self.pusher.shutdown() if self.pusher else True
        if self.server:
            self.server.stop()
        return delivered


def check(cfg: Config) -> list[str]:
    """What would stop the exporters' start in the files the config names, one line each: each
    file read as the start reads it, then the metrics server's certificate and key loaded.
    The agent runs it at --check-config and before it starts, so both report the same lines."""
    problems = files.problems(cfg)
    if not problems:
        try:
            tls.ssl_context(cfg.export.prometheus.tls)
        except ExportError as err:
            problems.append(str(err))
    return problems


def start(cfg: Config, metrics: Series, health: HealthChecks) -> Exporters:
    """Serve /metrics, /healthz and /readyz and start the OTLP pusher, for the agent's
    `metrics` and `health`. Raises ExportError."""
    tel = Exporters(metrics, build_resource(cfg))
    found = certs.check(cfg)
    certs.warn(found)
    metrics.set(CERTIFICATES, "", {v.setting: v.not_after for v in found})
    prom = cfg.export.prometheus
    app: MetricsApp | None = None  # without Prometheus the server answers only the probes
    if prom.enabled:
        from kubenpu.export.prometheus import MetricsApp  # prometheus_client: only for /metrics

        app = MetricsApp(metrics, tel.resource)
    tel.server = MetricsServer(prom, app, health, lambda where, n: metrics.set(EXHAUSTED, where, n))
    if cfg.export.otlp.enabled:
        from kubenpu.export.otlp import OtlpPusher  # the OTel SDK's metrics modules: only for OTLP

        try:
            tel.pusher = OtlpPusher(cfg.export.otlp, metrics, tel.resource)
        except ExportError:
            tel.shutdown()
            raise
        tel.pusher.start()
    return tel
