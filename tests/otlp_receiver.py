"""Real OTLP metrics receivers for tests: the opentelemetry-proto MetricsService over grpcio
(OtlpReceiver) and OTLP/HTTP protobuf on POST /v1/metrics (OtlpHttpReceiver).

`with OtlpReceiver() as rx:` listens on 127.0.0.1:rx.port (plaintext, or TLS with
`tls=(cert_pem, key_pem)`, and with `client_ca=ca_pem` it requires a client certificate that CA
signed: mutual TLS; OtlpHttpReceiver takes the same two); `rx.values("kubenpu.ioctl")` gives
{frozenset(attrs.items()): value} of the last push, `rx.metadata` the gRPC metadata (headers)
of each push, and `rx.answer_after = 3` holds each request 3 s before it answers (a slow
collector). Both refuse a request over 4 MiB, as a collector's gRPC receiver does by default
(grpcio's max message size).
"""

from __future__ import annotations

import gzip
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

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
        time.sleep(self._rx.answer_after)
        with self._rx.lock:
            self._rx.requests.append(request)
            self._rx.metadata.append(dict(context.invocation_metadata()))
        return svc.ExportMetricsServiceResponse()


MAX_REQUEST = 4 << 20


class _Received:
    """The requests a receiver took, and the metrics and values in them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Any] = []
        self.metadata: list[dict[str, str]] = []
        self.answer_after = 0.0  # seconds each request is held before its answer: a slow collector

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
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


class OtlpReceiver(_Received):
    def __init__(
        self, port: int = 0, tls: tuple[bytes, bytes] | None = None, client_ca: bytes | None = None
    ) -> None:
        super().__init__()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        svc_grpc.add_MetricsServiceServicer_to_server(_Service(self), self._server)
        addr = f"127.0.0.1:{port}"
        if tls:
            creds = grpc.ssl_server_credentials(
                [(tls[1], tls[0])], root_certificates=client_ca, require_client_auth=bool(client_ca)
            )
            self.port = self._server.add_secure_port(addr, creds)
        else:
            self.port = self._server.add_insecure_port(addr)
        if not self.port:
            raise OSError(f"cannot bind the OTLP receiver to {addr}")
        self._server.start()

    def stop(self) -> None:
        self._server.stop(grace=None).wait(5)


class _HttpHandler(BaseHTTPRequestHandler):
    server: _HttpServer

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        if self.path != "/v1/metrics" or length > MAX_REQUEST:
            self.send_error(404 if self.path != "/v1/metrics" else 413)
            return
        body = self.rfile.read(length)
        if self.headers.get("Content-Encoding") == "gzip":  # as a collector's receiver takes it
            body = gzip.decompress(body)
        request = svc.ExportMetricsServiceRequest.FromString(body)
        rx = self.server.rx
        time.sleep(rx.answer_after)
        with rx.lock:
            rx.requests.append(request)
            rx.metadata.append({k.lower(): v for k, v in self.headers.items()})
        body = svc.ExportMetricsServiceResponse().SerializeToString()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # a client that gave up on a slow answer
            pass

    def log_message(self, *args: object) -> None:
        pass


class _HttpServer(ThreadingHTTPServer):
    rx: OtlpHttpReceiver


def _tls_context(tls: tuple[bytes, bytes], client_ca: bytes | None) -> ssl.SSLContext:
    """ssl loads a certificate and key from files only."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as d:
        cert, key = Path(d, "cert.pem"), Path(d, "key.pem")
        cert.write_bytes(tls[0])
        key.write_bytes(tls[1])
        ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=client_ca.decode())
    return ctx


class OtlpHttpReceiver(_Received):
    def __init__(
        self, tls: tuple[bytes, bytes] | None = None, client_ca: bytes | None = None
    ) -> None:
        super().__init__()
        self._server = _HttpServer(("127.0.0.1", 0), _HttpHandler)
        self._server.rx = self
        if tls:
            self._server.socket = _tls_context(tls, client_ca).wrap_socket(
                self._server.socket, server_side=True
            )
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class Relay:
    """A TCP relay to 127.0.0.1:`port` that counts the bytes clients send through it: what a
    push costs on the wire, whatever the protocol encodes (gRPC hides its grpc-encoding
    header from the servicer). `with Relay(rx.port) as relay:` then push to relay.port."""

    def __init__(self, port: int) -> None:
        self.sent = 0
        self._target = port
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self._target))
            self._sockets += [client, upstream]
            for src, dst, count in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, count), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, count: bool) -> None:
        """Copies until src ends, then ends dst's writing side; closing is __exit__'s."""
        try:
            while data := src.recv(1 << 16):
                if count:
                    with self._lock:
                        self.sent += len(data)
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:  # the other side went away
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for sock in (self._listener, *self._sockets):
            sock.close()
