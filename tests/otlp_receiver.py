"""A real OTLP/gRPC metrics receiver for tests: the opentelemetry-proto MetricsService over grpcio.

`with OtlpReceiver() as rx:` listens on 127.0.0.1:rx.port (plaintext, or TLS with
`tls=(cert_pem, key_pem)`); `rx.values("kubenpu.ioctl")` gives {frozenset(attrs.items()): value}
of the last push, `rx.metadata` the gRPC metadata (headers) of each push.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as svc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc as svc_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric


def _any(v: AnyValue) -> Any:
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


def attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _any(kv.value) for kv in kvs}


class _Service(svc_grpc.MetricsServiceServicer):
    def __init__(self, rx: OtlpReceiver) -> None:
        self._rx = rx

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._rx.lock:
            self._rx.requests.append(request)
            self._rx.metadata.append(dict(context.invocation_metadata()))
        return svc.ExportMetricsServiceResponse()


class OtlpReceiver:
    def __init__(self, port: int = 0, tls: tuple[bytes, bytes] | None = None) -> None:
        self.lock = threading.Lock()
        self.requests: list[Any] = []
        self.metadata: list[dict[str, str]] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        svc_grpc.add_MetricsServiceServicer_to_server(_Service(self), self._server)
        addr = f"127.0.0.1:{port}"
        if tls:
            creds = grpc.ssl_server_credentials([(tls[1], tls[0])])
            self.port = self._server.add_secure_port(addr, creds)
        else:
            self.port = self._server.add_insecure_port(addr)
        if not self.port:
            raise OSError(f"cannot bind the OTLP receiver to {addr}")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def metrics(self, index: int = -1) -> Iterator[tuple[dict[str, Any], Metric]]:
        """(resource attributes, metric) for every metric of one request (default: the last)."""
        with self.lock:
            request = self.requests[index]
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    yield attrs(rm.resource.attributes), m

    def metric(self, name: str, index: int = -1) -> Metric:
        found = [m for _, m in self.metrics(index) if m.name == name]
        assert len(found) == 1, f"{name}: {len(found)} metrics in the request"
        return found[0]

    def values(self, name: str, index: int = -1) -> dict[frozenset, int | float]:
        """Data point values by attribute set, for a sum or gauge."""
        m = self.metric(name, index)
        points = getattr(m, m.WhichOneof("data")).data_points
        return {
            frozenset(attrs(p.attributes).items()): getattr(p, p.WhichOneof("value"))
            for p in points
        }
