"""The metrics server: /metrics (prometheus_client's WSGI app), /healthz and /readyz on one
socket, with TLS and auth in the spirit of the Prometheus exporter-toolkit."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import http.client
import io
import logging
import resource
import socket
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.message import Message
from typing import TYPE_CHECKING, Any, Protocol

from kubenpu.config import PrometheusConfig
from kubenpu.descriptors import METRICS_SERVER, Exhaustion, exhausted
from kubenpu.export.auth import Auth
from kubenpu.export.errors import ExportError, PortInUseError
from kubenpu.export.tls import ssl_context

if TYPE_CHECKING:
    from kubenpu.export.prometheus import MetricsApp

log = logging.getLogger(__name__)


class HealthChecks(Protocol):
    """What /healthz and /readyz report (the agent's Health): (ok, one-line reason)."""

    def live(self) -> tuple[bool, str]: ...

    def ready(self) -> tuple[bool, str]: ...


_BACKLOG = 1024  # connections beyond _MAX_OPEN wait here, in the kernel
_MAX_OPEN = 4096  # connections held at once: bounds the file descriptors a flood can take
# Descriptors left to the rest of the agent below the soft limit: BPF maps and links, cgroup
# walks (one per level), fdinfo reads, gRPC channels to the CRI and the collector.
_FD_RESERVE = 512
_MAX_HEAD = 16 * 1024  # request line and headers; a scrape sends a few hundred bytes
_Response = tuple[str, list[tuple[str, str]], bytes]


def _text(status: str, body: str, *headers: tuple[str, str]) -> _Response:
    return status, [("Content-Type", "text/plain; charset=utf-8"), *headers], body.encode()


class MetricsServer:
    """/metrics (prometheus_client's WSGI app), /healthz and /readyz on one socket.

    One event-loop thread accepts connections and reads requests, so an idle or slow client
    costs a few KiB, not a thread. It holds at most max_open() connections; more wait in the
    kernel's listen backlog, and when one comes while all are held, the oldest connection still
    sending its request is dropped to make room. Each connection must send its whole request within
    read_timeout_seconds (TLS handshake included) and gets one answer (Connection: close).
    At most max_connections answers are made and sent at once: each is made on a worker thread
    and sent from the event loop."""

    def __init__(
        self,
        cfg: PrometheusConfig,
        metrics_app: MetricsApp | None,
        health: HealthChecks,
        on_exhausted: Callable[[str, int], None] | None = None,
    ) -> None:
        self._cfg = cfg
        self._exhaustion = Exhaustion(METRICS_SERVER, on_exhausted)
        self._app = metrics_app
        self._health = health
        self._auth = Auth(cfg.auth)
        self._tls = ssl_context(cfg.tls)
        self._sock = _listen(cfg.host, cfg.port)
        self.port = self._sock.getsockname()[1]
        self._pool = ThreadPoolExecutor(cfg.max_connections, thread_name_prefix="metrics")
        self._shared = _SharedRender()
        self._loop = asyncio.new_event_loop()
        self._main = self._loop.create_task(self._accept_loop())
        self._thread = threading.Thread(target=self._run, name="metrics-io", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._main)
        self._loop.close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        held = asyncio.Semaphore(max_open())
        answering = asyncio.Semaphore(self._cfg.max_connections)
        self._sock.setblocking(False)
        tasks: set[asyncio.Task[None]] = set()
        waiting: dict[asyncio.Task[None], None] = {}  # no whole request yet, oldest first
        failing = False
        try:
            while True:
                try:
                    conn, _ = await loop.sock_accept(self._sock)
                except OSError as err:
                    if exhausted(err):  # counted, and logged once a streak
                        self._exhaustion.failed()
                    elif not failing:  # other errors: once a streak
                        log.warning("metrics server cannot accept: %s; retrying", err.strerror)
                    failing = True
                    await asyncio.sleep(0.1)
                    continue
                if failing:
                    self._exhaustion.ok()
                failing = False
                await _slot(held, waiting)
                task = loop.create_task(self._connection(conn, held, answering, waiting))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                task.add_done_callback(lambda t: waiting.pop(t, None))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _connection(
        self,
        conn: socket.socket,
        held: asyncio.Semaphore,
        answering: asyncio.Semaphore,
        waiting: dict[asyncio.Task[None], None],
    ) -> None:
        loop = asyncio.get_running_loop()
        me = asyncio.current_task()
        assert me is not None
        # Evictable once running: a task cancelled before it starts would never release `held`.
        waiting[me] = None
        timeout = self._cfg.read_timeout_seconds
        conn_protocol = _Connection(loop)
        transport: asyncio.BaseTransport | None = None
        try:
            async with asyncio.timeout(timeout):
                # The handshake is bounded by the enclosing timeout.
                transport, _ = await loop.connect_accepted_socket(
                    lambda: conn_protocol, conn, ssl=self._tls
                )
                head = await conn_protocol.head
            waiting.pop(me, None)  # answering it: not to be evicted
            async with answering:
                response = await loop.run_in_executor(self._pool, self._answer, head)
                async with asyncio.timeout(timeout):
                    await conn_protocol.send(response)
        except OSError:  # incl. TimeoutError and ssl.SSLError
            pass  # the client went away, was too slow, or spoke no HTTP (or no TLS)
        finally:
            conn_protocol.head.cancel()  # an evicted one's: no exception left unretrieved
            if transport is None:
                conn.close()
            else:
                transport.abort()
            held.release()

    def _answer(self, head: bytes) -> bytes:
        try:
            status, headers, body = self._respond(head)
        except Exception as err:  # e.g. a collector's bug: one scrape fails, not the server
            log.warning("cannot answer a request to the metrics server: %r", err)
            status, headers, body = _text("500 Internal Server Error", "internal error\n")
        lines = [f"HTTP/1.1 {status}", *(f"{k}: {v}" for k, v in headers)]
        lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
        return "\r\n".join(lines).encode("latin-1") + body

    def _respond(self, head: bytes) -> _Response:
        if not head:
            return _text("431 Request Header Fields Too Large", "request head too large\n")
        request_line, _, rest = head.partition(b"\r\n")
        parts = request_line.decode("latin-1").split()
        if len(parts) != 3:
            return _text("400 Bad Request", "bad request line\n")
        method, target, _ = parts
        try:
            headers = http.client.parse_headers(io.BytesIO(rest))
        except http.client.HTTPException:
            return _text("400 Bad Request", "bad headers\n")
        if method not in ("GET", "HEAD"):
            return _text("405 Method Not Allowed", "use GET\n", ("Allow", "GET, HEAD"))
        path, _, query = target.partition("?")
        response = self._route(path, query, headers)
        return (response[0], response[1], b"") if method == "HEAD" else response

    def _route(self, path: str, query: str, headers: Message) -> _Response:
        if path in ("/healthz", "/readyz"):
            ok, reason = self._health.live() if path == "/healthz" else self._health.ready()
            return (
                _text("200 OK", "ok\n") if ok else _text("503 Service Unavailable", reason + "\n")
            )
        if path != "/metrics" or self._app is None:
            return _text("404 Not Found", "not found: try /metrics, /healthz or /readyz\n")
        if self._auth.required() and not self._auth.allows(headers.get("Authorization", "")):
            return _text("401 Unauthorized", "unauthorized\n", self._auth.challenge())
        return self._metrics(query, headers)

    def _metrics(self, query: str, headers: Message) -> _Response:
        accept, encoding = headers.get("Accept", ""), headers.get("Accept-Encoding", "")
        if query:  # a filtered scrape (name[]=...) is rare: render it on its own
            return self._render(accept, encoding, query)
        # Scrapes that get the same bytes share one render (the key bounds the variants).
        assert self._app is not None
        key = self._app.variant(accept, encoding)
        return self._shared(key, lambda: self._render(accept, encoding, ""))

    def _render(self, accept: str, encoding: str, query: str) -> _Response:
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": "/metrics",
            "QUERY_STRING": query,
            "HTTP_ACCEPT": accept,
            "HTTP_ACCEPT_ENCODING": encoding,
        }
        started: list[Any] = []
        assert self._app is not None
        body = b"".join(self._app(environ, lambda status, hdrs: started.extend((status, hdrs))))
        return started[0], started[1], body

    def stop(self) -> None:
        """Stop accepting and drop the connections open now (a scrape in progress is cut)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._main.cancel)
            self._thread.join()
        self._sock.close()
        self._pool.shutdown(wait=True)


@dataclass
class _Batch:
    done: threading.Event = field(default_factory=threading.Event)
    response: _Response | None = None
    error: Exception | None = None


class _SharedRender:
    """Concurrent scrapes share renders. A scrape joins the next render of its key that has not
    started yet, so its answer is never older than its request, and N concurrent scrapes cost
    about two renders instead of N (each holding its own copy of the exposition)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Hashable, _Batch] = {}
        self._running: dict[Hashable, threading.Lock] = {}

    def __call__(self, key: Hashable, render: Callable[[], _Response]) -> _Response:
        with self._lock:
            batch = self._pending.get(key)
            leader = batch is None
            if batch is None:
                batch = self._pending[key] = _Batch()
            running = self._running.setdefault(key, threading.Lock())
        if leader:
            with running:  # one render of a key at a time; newcomers queue for the next
                with self._lock:
                    del self._pending[key]
                try:
                    batch.response = render()
                except Exception as err:
                    batch.error = err
                finally:
                    batch.done.set()
        batch.done.wait()
        if batch.error:
            raise batch.error
        assert batch.response is not None
        return batch.response


class _Connection(asyncio.Protocol):
    """Collects one request head (bounded); then sends one answer, waiting while the client
    reads slowly rather than buffering without bound."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.head: asyncio.Future[bytes] = loop.create_future()
        self._buf = b""
        self._transport: asyncio.Transport | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self.head.done():
            return  # one request per connection; anything after it is ignored
        # Only the cap is kept, whatever one read brings: a 250 KB header was held whole, and a
        # 17.5 KB head that ended in the same write was answered.
        self._buf += data[: _MAX_HEAD - len(self._buf)]
        end = self._buf.find(b"\r\n\r\n")
        if end >= 0 or len(self._buf) >= _MAX_HEAD:
            self.head.set_result(self._buf[: end + 2] if end >= 0 else b"")
            self._buf = b""

    def eof_received(self) -> bool:
        if not self.head.done():
            self.head.set_exception(ConnectionResetError("closed before a whole request"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.head.done():
            self.head.set_exception(ConnectionResetError("closed before a whole request"))
        if not self._closed.done():
            self._closed.set_result(None)
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def send(self, data: bytes) -> None:
        """Write in chunks as the client reads, then close and wait until all is sent."""
        assert self._transport is not None
        for i in range(0, len(data), 65536):
            await self._writable.wait()
            if self._closed.done():
                raise ConnectionResetError("the client closed the connection")
            self._transport.write(data[i : i + 65536])
        self._transport.close()
        await self._closed


async def _slot(held: asyncio.Semaphore, waiting: dict[asyncio.Task[None], None]) -> None:
    """A connection slot. When all are held, the oldest connection still sending its request
    makes room, so a kubelet probe is answered under a flood of idle connections."""
    if held.locked():
        await asyncio.sleep(0)  # the connections accepted last start, and become evictable
        if waiting:
            oldest = next(iter(waiting))
            del waiting[oldest]
            oldest.cancel()
    await held.acquire()


def max_open() -> int:
    """Connections held at once: _MAX_OPEN, or fewer when the descriptor limit would leave the
    rest of the agent less than _FD_RESERVE (a limit of 1,024 and 1,100 idle connections made
    a cgroup walk fail with EMFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return _MAX_OPEN
    return max(16, min(_MAX_OPEN, soft - _FD_RESERVE))


def _listen(host: str, port: int) -> socket.socket:
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
            sock.listen(_BACKLOG)
        except OSError:
            sock.close()
            raise
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise PortInUseError(
                f"metrics port {host}:{port} is already in use (export.prometheus.port)"
            ) from None
        why = getattr(err, "strerror", None) or err
        raise ExportError(f"cannot serve metrics on {host}:{port}: {why}") from None
    return sock
