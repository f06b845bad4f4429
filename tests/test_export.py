"""kubenpu.export over OTLP/gRPC (a real grpcio receiver) and /metrics (a real HTTP server)."""

from __future__ import annotations

import base64
import io
import logging
import os
import resource
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import certifi
import pytest
from fakes import Clock
from helpers import (
    StubHealth,
    calls,
    eventually,
    free_port,
    ioctl,
    ioctl_counts,
    make_config,
    otlp_counts,
    scrape,
    start_telemetry,
    values,
)
from opentelemetry.semconv.attributes import k8s_attributes
from opentelemetry.semconv.schemas import Schemas
from otlp_receiver import OtlpHttpReceiver, OtlpReceiver, Relay, attrs
from vm.guestlib import parse

from kubenpu import __version__, config, export
from kubenpu.export import otlp
from kubenpu.files import read_at_most
from kubenpu.kernel import abi
from kubenpu.kernel.records import Durations, JobTimes, Key
from kubenpu.metrics.catalogue import (
    ALLOCATED,
    ALLOCATED_IDLE,
    ALLOCATED_IDLE_FOR,
    ENGINE_BUSY,
    ENGINE_COUNTERS,
    ENGINE_CYCLES,
    EXPORT_ERRORS,
    K8S_ATTRIBUTES,
    OVERFLOW_ATTRS,
    POD_HANGS,
    POD_LABELS,
    RESET_VICTIMS,
    SCHEMA_URL,
    SPECS,
    UNALLOCATED_CALLS,
    Spec,
)
from kubenpu.metrics.inputs import DeviceRow, Where
from kubenpu.metrics.own import DEVICES
from kubenpu.metrics.points import Point
from kubenpu.metrics.series import Series
from kubenpu.sources.calls.attribution import DURATIONS, REMOTE, UNNAMED
from kubenpu.sources.jobs import BEHIND, IDLE, JOB_TIMES, RESETS
from kubenpu.sources.registry import FAMILIES
from kubenpu.sources.telemetry import POD_ENERGY_SHARES
from kubenpu.sources.usage import ENGINES, GAUGES

HOUR = 3600.0  # an interval long enough that only explicit flushes push


def otlp_yaml(port: int, extra: str = "") -> str:
    return f"""\
export:
  prometheus: {{enabled: false}}
  otlp:
    enabled: true
    endpoint: http://127.0.0.1:{port}
    interval_seconds: {HOUR}
    timeout_seconds: 1
{extra}"""


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture
def clean_resource_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)


def test_call_durations_push_as_the_kernels_exponential_buckets(tmp_path, receiver):
    """The kernel's buckets go out as they are: an ExponentialHistogram at scale 2 from index
    -80, the calls of at most 2^-20 s as its zero bucket, over 64 s in the bucket above 64 s;
    two cgroups of one container summed bucket by bucket; errors by name beside it."""
    cfg = make_config(tmp_path, otlp_yaml(receiver.port))
    tel = start_telemetry(cfg)
    where = Where("ns", "p", "u-1", "c", "0000:03:00.0", "vgem")
    slots = [0] * abi.DURATION_SLOTS
    slots[0], slots[45], slots[abi.BUCKETS + 1] = 1, 2, 1  # under, (1.95, 2.32] ms, over 64 s
    errors = [0] * len(abi.ERRORS)
    errors[abi.ERRORS.index("ENOMEM")] = 2
    try:
        m = tel.metrics
        calls(m, "ns", "p", "c", 6, kind="alloc", uid="u-1")
        alloc_1 = Durations(70_000, tuple(slots), tuple(errors))
        m.put(DURATIONS, where, "alloc", (Key(1, 226, 0, 2), alloc_1))
        alloc_2 = Durations(30_000, tuple(slots), (0,) * 15)
        m.put(DURATIONS, where, "alloc", (Key(2, 226, 0, 2), alloc_2))
        wait = Durations(1, tuple(slots), (0,) * 15)
        m.put(DURATIONS, where, "wait", (Key(2, 226, 0, 3), wait))
        assert tel.pusher.push()
    finally:
        tel.shutdown()
    metric = receiver.metric("kubenpu.ioctl.duration")
    assert (metric.unit, metric.exponential_histogram.aggregation_temporality) == ("s", 2)
    [point] = metric.exponential_histogram.data_points  # no calls counted for wait: not timed
    assert attrs(point.attributes)[k8s_attributes.K8S_POD_NAME] == "p"
    assert (point.scale, point.positive.offset, point.zero_count) == (2, -80, 2)
    counts = list(point.positive.bucket_counts)
    assert len(counts) == abi.BUCKETS + 1
    assert {abi.FIRST_INDEX + i: n for i, n in enumerate(counts) if n} == {-36: 4, 24: 2}
    assert (point.count, point.sum) == (8, 100_000 / 1e9)
    assert (point.min, point.max) == (0.0, 2 ** (25 / 4))  # bucket bounds: no extremes kept
    errors_sent = receiver.values("kubenpu.ioctl.errors")
    assert [dict(k)["error"] for k in errors_sent] == ["ENOMEM"]
    assert list(errors_sent.values()) == [2]


def test_a_histogram_past_2_64_observations_is_refused_counted_and_the_push_goes_on(
    tmp_path, receiver
):
    """A series sums its cgroups' histograms (a restarted container's two): one past 2^64-1
    observations, which OTLP carries as uint64, once failed every push for every pod. The update
    that would pass it is refused and counted by source; the series keeps its last value."""
    cfg = make_config(tmp_path, otlp_yaml(receiver.port))
    tel = start_telemetry(cfg)
    top = (2**64 - 1,) + (0,) * (abi.DURATION_SLOTS - 1)
    one = (1,) + (0,) * (abi.DURATION_SLOTS - 1)
    errors = (0,) * len(abi.ERRORS)
    try:
        m = tel.metrics
        calls(m, "ns", "p", "c", 3, uid="u-1")
        where = Where("ns", "p", "u-1", "c", "0000:03:00.0", "vgem")
        assert m.put(DURATIONS, where, "submit", (Key(1, 226, 0, 1), Durations(1, top, errors)))
        assert not m.put(DURATIONS, where, "submit", (Key(2, 226, 0, 1), Durations(1, one, errors)))
        full, more = Durations(1, top, ()), Durations(1, one, ())
        assert m.put(JOB_TIMES, where, "gfx_0.0.0", (1, JobTimes(1, 1, full, full)))
        assert not m.put(JOB_TIMES, where, "gfx_0.0.0", (2, JobTimes(1, 1, more, more)))
        assert m.put(JOB_TIMES, where, "gfx_0.0.0", (1, JobTimes(1, 1, full, full)))  # no more
        assert tel.pusher.push()
    finally:
        tel.shutdown()
    [point] = receiver.metric("kubenpu.ioctl.duration").exponential_histogram.data_points
    assert point.count == 2**64 - 1
    refused = receiver.values("kubenpu.series.refused")
    assert {dict(k)["source"]: n for k, n in refused.items()} == {
        "durations": 1,
        "jobs": 1,
        "jobs_behind": 0,
        "jobs_idle": 0,
        "remote_node": 0,  # a count: no observations to bound, never refused
        "resets": 0,
    }


def test_grpc_push_exact_values_resource_and_headers(tmp_path, receiver, clean_resource_env):
    cfg = make_config(tmp_path, otlp_yaml(receiver.port, "    headers: {x-tenant: t1}\n"))
    tel = start_telemetry(cfg)
    try:
        m = tel.metrics
        calls(m, "ns", "p", "c", 41)
        calls(m, "ns", "p", "c", 1)
        calls(m, "", "", "", 5)
        m.set(UNNAMED, "not_indexed", 5)
        m.set(DEVICES, cfg.node_name, [DeviceRow("0000:03:00.0", "vgem", "vgem", "1af4:1050", "1")])
        assert tel.pusher.push()
    finally:
        tel.shutdown()
    assert receiver.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 42, ioctl("", "", ""): 5}
    ioctl_metric = receiver.metric("kubenpu.ioctl")
    assert ioctl_metric.sum.is_monotonic
    assert ioctl_metric.sum.aggregation_temporality == 2  # CUMULATIVE
    assert ioctl_metric.unit == "{call}"
    assert (
        receiver.values("kubenpu.unattributed_calls")[frozenset({("reason", "not_indexed")})] == 5
    )
    assert receiver.values("kubenpu.device.info") == {
        frozenset(
            {
                "device": "0000:03:00.0",
                "vendor": "vgem",
                "driver": "vgem",
                "pci_id": "1af4:1050",
                "numa_node": "1",
                "node": "node-a",
            }.items()
        ): 1
    }
    resource = next(receiver.metrics())[0]
    assert resource["service.name"] == "kubenpu"
    assert resource["service.version"] == __version__
    assert resource["k8s.node.name"] == "node-a"
    # A Prometheus OTLP receiver's instance label: one per node, so nodes' series stay apart.
    assert resource["service.instance.id"] == "node-a"
    assert resource["host.name"] == "node-a"  # the node's, not the pod's gethostname()
    assert receiver.metadata[-1]["x-tenant"] == "t1"


def test_resource_env_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=ignored,k8s.cluster.name=c1")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "npu-agent")
    attributes = export.build_resource(config.Config(node_name="n")).attributes
    assert (attributes["service.name"], attributes["k8s.cluster.name"]) == ("npu-agent", "c1")
    assert attributes["k8s.node.name"] == "n"


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def root_log() -> Iterator[Records]:
    """What the agent's log shows: records reaching the root logger (caplog cannot tell, as
    pytest also hooks loggers that do not propagate)."""
    handler, root = Records(), logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old_level)


def push_calls(cfg: config.Config, n: int) -> bool:
    """Start the exporters, record n calls of one pod, push once, stop: was it delivered?"""
    tel = start_telemetry(cfg)
    try:
        calls(tel.metrics, "ns", "p", "c", n)
        return tel.pusher.push()
    finally:
        tel.shutdown()


def delivered(tel: export.Exporters, attempts: int = 3) -> bool:
    """Push until one push is delivered, as the timer would. Right after the collector comes
    back, gRPC may still be in its reconnect backoff, so the first push can fail."""
    return any(tel.pusher.push() for _ in range(attempts))


def test_collector_down_at_start_and_mid_run_loses_nothing(tmp_path, receiver, root_log):
    port = receiver.port
    receiver.stop()  # down at start
    cfg = make_config(tmp_path, otlp_yaml(port))
    cfg.export.otlp.timeout_seconds = 3  # room for the exporter's own retry after a reconnect
    tel = start_telemetry(cfg)
    root_log.records.clear()  # asyncio's debug line as the metrics server starts
    try:
        calls(tel.metrics, "ns", "p", "c", 10)
        assert not tel.pusher.push()
        # One line per failed push, none from the OTel exporter itself.
        assert [r.name for r in root_log.records] == ["kubenpu.export.otlp"]
        assert "failed (1 in a row)" in root_log.records[0].getMessage()
        # The exporter's reason, as gRPC gives it for a collector that is down: refused, or
        # the push's deadline reached first when a loaded machine is slow to get the refusal
        # (seen under `nice -n 19` beside a CI run: DEADLINE_EXCEEDED).
        reason = root_log.records[0].getMessage()
        assert "StatusCode.UNAVAILABLE" in reason or "StatusCode.DEADLINE_EXCEEDED" in reason
        with OtlpReceiver(port=port) as rx:  # the collector comes up
            calls(tel.metrics, "ns", "p", "c", 5)
            assert delivered(tel)
            assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 15}
        calls(tel.metrics, "ns", "p", "c", 7)  # ...goes down mid-run...
        assert not tel.pusher.push()
        assert not tel.pusher.push()
        calls(tel.metrics, "ns", "p", "c", 3)
        with OtlpReceiver(port=port) as rx:  # ...and comes back: cumulative counts, nothing lost
            assert delivered(tel)
            assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 25}
            errors = dict(tel.metrics.collect())[EXPORT_ERRORS][0].value
            assert errors >= 3
            assert rx.values("kubenpu.otlp.export.errors") == {frozenset(): errors}
    finally:
        tel.shutdown()


def test_periodic_push_runs_on_its_own(tmp_path, receiver):
    cfg = make_config(tmp_path, otlp_yaml(receiver.port))
    cfg.export.otlp.interval_seconds = 0.05
    tel = start_telemetry(cfg)
    calls(tel.metrics, "ns", "p", "c", 3)
    eventually(lambda: len(receiver.requests) > 0, "a periodic push, before any stop")
    assert tel.shutdown()  # joins the timer thread, which makes the final push
    assert len(receiver.requests) >= 2
    assert receiver.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 3}


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1, made with the openssl tool."""
    d = tmp_path_factory.mktemp("tls")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=kubenpu test CA",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    )
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr",
        "-subj", "/CN=kubenpu agent")  # fmt: skip
    run("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "client.pem", "-days", "2")  # fmt: skip
    names = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")
    return {name: d / name for name in names}


def test_grpc_tls_with_ca_certificate_from_env(tmp_path, tls_files):
    tls = (tls_files["server.pem"].read_bytes(), tls_files["server.key"].read_bytes())
    with OtlpReceiver(tls=tls) as rx:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rx.port}",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls_files["ca.pem"]),
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20s3cret",
        }
        assert push_calls(make_config(tmp_path, otlp_yaml(0), env), 9)
        assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 9}
        assert rx.metadata[-1]["authorization"] == "Bearer s3cret"
    # Without the CA the server is not trusted: the push fails, it does not crash.
    with OtlpReceiver(tls=tls) as rx:
        tel = start_telemetry(
            make_config(
                tmp_path,
                otlp_yaml(0),
                {"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rx.port}"},
            )
        )
        try:
            assert not tel.pusher.push()
        finally:
            tel.shutdown()
        assert rx.requests == []


def test_unreadable_certificate_is_a_clear_error(tmp_path):
    cfg = make_config(
        tmp_path,
        otlp_yaml(4317, "    certificate: /nonexistent/ca.pem\n"),
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317"},
    )
    with pytest.raises(
        export.ExportError, match=r"cannot read export.otlp.certificate /nonexistent/ca\.pem"
    ):
        start_telemetry(cfg)


def prom_yaml(port: int) -> str:
    return f"export: {{prometheus: {{host: 127.0.0.1, port: {port}}}}}\n"


def test_metrics_port_in_use_is_a_specific_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(export.PortInUseError) as err:
            start_telemetry(make_config(tmp_path, prom_yaml(port)))
    assert str(err.value) == (
        f"metrics port 127.0.0.1:{port} is already in use (export.prometheus.port)"
    )
    assert "\n" not in str(err.value)


def test_retired_series_disappear_from_metrics_and_otlp(tmp_path, receiver):
    port = free_port()
    text = otlp_yaml(receiver.port).replace(
        "{enabled: false}", f"{{host: 127.0.0.1, port: {port}}}"
    )
    text += "metrics: {series_ttl_seconds: 60}\n"
    clock = Clock()
    tel = start_telemetry(make_config(tmp_path, text), clock=clock)
    try:
        calls(tel.metrics, "ns", "gone", "c", 2)
        calls(tel.metrics, "ns", "stays", "c", 3)
        assert tel.pusher.push()
        assert 'pod="gone"' in scrape(port)
        tel.metrics.gone(Where("ns", "gone", "", "c", "", ""))
        clock.now += 60
        body = scrape(port)
        assert 'pod="gone"' not in body
        assert 'pod="stays"' in body
        assert tel.pusher.push()
        assert receiver.values("kubenpu.ioctl") == {ioctl("ns", "stays", "c"): 3}
    finally:
        tel.shutdown()


def test_overflow_series_on_both_paths(tmp_path, receiver):
    port = free_port()
    text = otlp_yaml(receiver.port).replace(
        "{enabled: false}", f"{{host: 127.0.0.1, port: {port}}}"
    )
    tel = start_telemetry(make_config(tmp_path, text + "metrics: {max_series: 1}\n"))
    try:
        calls(tel.metrics, "ns", "a", "c", 2)
        calls(tel.metrics, "ns", "b", "c", 3)
        calls(tel.metrics, "ns", "d", "c", 4)
        assert tel.pusher.push()
        assert 'kubenpu_ioctl_total{otel_metric_overflow="true"} 7.0' in scrape(port)
    finally:
        tel.shutdown()
    got = receiver.values("kubenpu.ioctl")
    assert got == {ioctl("ns", "a", "c"): 2, frozenset(OVERFLOW_ATTRS.items()): 7}
    assert receiver.values("kubenpu.overflow_calls") == {frozenset(): 7}
    point = receiver.metric("kubenpu.ioctl").sum.data_points[-1]
    assert attrs(point.attributes) == {"otel.metric.overflow": True}


# --- the metrics endpoint: health, TLS, auth, bounded connections


def server_yaml(port: int, extra: str = "") -> str:
    return f"export:\n  prometheus:\n    host: 127.0.0.1\n    port: {port}\n{extra}"


def get(
    port: int,
    path: str,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, str, dict[str, str]]:
    """(status, body, headers) of a GET; an HTTP error status is an answer, not an exception."""
    scheme = "https" if context else "http"
    req = urllib.request.Request(f"{scheme}://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


@pytest.mark.parametrize("metrics_enabled", [True, False])
def test_healthz_and_readyz_report_the_agents_health(tmp_path, metrics_enabled):
    port = free_port()
    health = StubHealth()
    extra = "" if metrics_enabled else "    enabled: false\n"
    tel = start_telemetry(make_config(tmp_path, server_yaml(port, extra)), health=health)
    try:
        assert get(port, "/healthz")[:2] == (200, "ok\n")
        assert get(port, "/readyz")[:2] == (200, "ok\n")
        health.is_live = (False, "attribution thread died: ValueError: bad kind 9")
        health.is_ready = (False, "probe not attached yet")
        assert get(port, "/healthz")[:2] == (
            503,
            "attribution thread died: ValueError: bad kind 9\n",
        )
        assert get(port, "/readyz")[:2] == (503, "probe not attached yet\n")
        status, body, _ = get(port, "/metrics")
        assert status == (200 if metrics_enabled else 404)
        assert ("kubenpu_events_received_total" in body) is metrics_enabled
    finally:
        tel.shutdown()


def test_requests_other_than_get_and_unknown_paths(tmp_path):
    port = free_port()
    tel = start_telemetry(make_config(tmp_path, server_yaml(port)))
    try:
        assert get(port, "/nope")[0] == 404
        post = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x")
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(post, timeout=10)
        assert err.value.code == 405
        for request, status, body in [
            (b"garbage\r\n\r\n", b"400", b"bad request line\n"),
            (b"GET /metrics HTTP/1.1\r\nX: " + b"x" * 20000, b"431", b"request head too large\n"),
            # One write holding a whole head past the cap was answered 200.
            (
                b"GET /healthz HTTP/1.1\r\nX: " + b"x" * 17500 + b"\r\n\r\n",
                b"431",
                b"request head too large\n",
            ),
            (b"HEAD /healthz HTTP/1.1\r\n\r\n", b"200", b""),
        ]:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(request)
                answer = s.makefile("rb").read()
            assert answer.startswith(b"HTTP/1.1 " + status + b" "), answer[:100]
            assert answer.endswith(b"\r\n\r\n" + body)
        assert "kubenpu_events_received_total" in scrape(port)
    finally:
        tel.shutdown()


def test_metrics_over_tls(tmp_path, tls_files):
    port = free_port()
    tls = (
        f"    tls: {{cert_file: {tls_files['server.pem']}, key_file: {tls_files['server.key']}}}\n"
    )
    tel = start_telemetry(make_config(tmp_path, server_yaml(port, tls)))
    try:
        calls(tel.metrics, "ns", "p", "c", 7)
        trusted = ssl.create_default_context(cafile=str(tls_files["ca.pem"]))
        status, body, _ = get(port, "/metrics", context=trusted)
        assert status == 200
        assert 'kubenpu_ioctl_total{container="c"' in body
        assert get(port, "/healthz", context=trusted)[:2] == (200, "ok\n")
        # Plain HTTP to the TLS port gets no answer, and the server keeps serving.
        with pytest.raises(OSError):
            get(port, "/metrics")
        with pytest.raises(urllib.error.URLError) as err:
            get(port, "/metrics", context=ssl.create_default_context())  # CA not trusted
        assert isinstance(err.value.reason, ssl.SSLCertVerificationError)
        assert get(port, "/metrics", context=trusted)[0] == 200
    finally:
        tel.shutdown()


def test_missing_tls_files_are_a_clear_error(tmp_path):
    tls = "    tls: {cert_file: /nonexistent/c.pem, key_file: /nonexistent/c.key}\n"
    with pytest.raises(export.ExportError) as err:
        start_telemetry(make_config(tmp_path, server_yaml(free_port(), tls)))
    assert str(err.value) == (
        "cannot read export.prometheus.tls.cert_file /nonexistent/c.pem: No such file or directory"
    )


def test_an_encrypted_key_is_a_clear_error_never_a_prompt(tmp_path, tls_files):
    """It prompted `Enter PEM pass phrase:` on the terminal, then exited "Invalid argument"."""
    key = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(tls_files["server.key"]), "-aes256", "-passout", "pass:x"],
        stdout=key.open("wb"),
        check=True,
    )
    tls = f"    tls: {{cert_file: {tls_files['server.pem']}, key_file: {key}}}\n"
    with pytest.raises(export.ExportError) as err:
        start_telemetry(make_config(tmp_path, server_yaml(free_port(), tls)))
    assert str(err.value) == (
        f"export.prometheus.tls.key_file {key} is encrypted: give an unencrypted key "
        "(openssl pkey -in KEY -out PLAIN)"
    )


@pytest.mark.parametrize(
    "setting", ["auth: {bearer_token_file: F}", "tls: {cert_file: F, key_file: F}"]
)
def test_a_secret_that_is_a_fifo_is_refused_not_waited_on(tmp_path, setting):
    """A password_file that was a FIFO blocked the start: /healthz was refused for > 15 s."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    text = server_yaml(free_port(), f"    {setting.replace('F', str(fifo))}\n")
    with pytest.raises(export.ExportError, match=r": a FIFO, not a regular file$"):
        start_telemetry(make_config(tmp_path, text))


def test_an_otlp_tls_file_that_is_a_fifo_is_refused(tmp_path):
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    text = otlp_yaml(free_port(), f"    certificate: {fifo}\n    protocol: http/protobuf\n")
    with pytest.raises(
        export.ExportError,
        match=rf"^cannot read export.otlp.certificate {fifo}: a FIFO, not a regular file$",
    ):
        start_telemetry(make_config(tmp_path, text))


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.mark.parametrize("schemes", [("basic",), ("bearer",), ("basic", "bearer")])
def test_metrics_auth_required_denied_allowed(tmp_path, schemes):
    (tmp_path / "password").write_text("pa55word\n")
    (tmp_path / "token").write_text("t0ken\n")
    auth = {
        "basic": f"username: prom, password_file: {tmp_path / 'password'}",
        "bearer": f"bearer_token_file: {tmp_path / 'token'}",
    }
    port = free_port()
    text = server_yaml(port, f"    auth: {{{', '.join(auth[s] for s in schemes)}}}\n")
    tel = start_telemetry(make_config(tmp_path, text))
    try:
        status, _, headers = get(port, "/metrics")
        assert status == 401
        assert headers["WWW-Authenticate"] == (
            'Basic realm="kubenpu"' if "basic" in schemes else "Bearer"
        )
        denied = [basic("prom", "wrong"), basic("other", "pa55word"), {"Authorization": "Bearer x"}]
        for h in denied:
            assert get(port, "/metrics", h)[0] == 401, h
        allowed = {"basic": basic("prom", "pa55word"), "bearer": {"Authorization": "Bearer t0ken"}}
        for scheme, h in allowed.items():
            assert get(port, "/metrics", h)[0] == (200 if scheme in schemes else 401), scheme
        # Kubelet probes carry no credentials.
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/readyz")[0] == 200
    finally:
        tel.shutdown()


def test_unreadable_auth_secret_is_a_clear_error(tmp_path):
    text = server_yaml(free_port(), "    auth: {bearer_token_file: /nonexistent/token}\n")
    with pytest.raises(export.ExportError) as err:
        start_telemetry(make_config(tmp_path, text))
    assert str(err.value) == (
        "cannot read export.prometheus.auth.bearer_token_file /nonexistent/token: "
        "No such file or directory"
    )


def metrics_threads() -> int:
    return sum(t.name.startswith("metrics") for t in threading.enumerate())


def test_idle_connections_cost_no_threads_and_are_dropped(tmp_path):
    port = free_port()
    extra = "    max_connections: 4\n    read_timeout_seconds: 0.5\n"
    tel = start_telemetry(make_config(tmp_path, server_yaml(port, extra)))
    idle: list[socket.socket] = []
    try:
        assert "kubenpu_events_received_total" in scrape(port)
        threads = metrics_threads()
        assert threads <= 1 + 4  # the event loop and at most max_connections workers
        for _ in range(2):
            idle += [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(200)]
            # Behind 200 more idle connections a scrape still gets through, on no new thread.
            assert "kubenpu_events_received_total" in scrape(port)
            assert metrics_threads() == threads
        # The server closes idle connections (EOF, no answer) after the read timeout.
        for s in idle:
            assert s.recv(4096) == b""
    finally:
        for s in idle:
            s.close()
        tel.shutdown()
    assert metrics_threads() == 0


def test_a_slow_client_does_not_hold_the_server_and_is_cut_off(tmp_path):
    port = free_port()
    extra = "    max_connections: 1\n    read_timeout_seconds: 0.5\n"
    tel = start_telemetry(make_config(tmp_path, server_yaml(port, extra)))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"GET /metrics HTTP/1.1\r\n")  # and never the end of the headers
            assert get(port, "/healthz")[0] == 200
            assert slow.recv(4096) == b""  # cut off after the read timeout
            assert get(port, "/healthz")[0] == 200
    finally:
        tel.shutdown()


# --- OTLP: header keys as the OTel SDK sends them; a bounded stop


def test_capitalised_header_keys_reach_a_real_grpc_receiver(tmp_path, receiver):
    """grpcio refuses upper-case metadata keys ("Invalid metadata") on every push."""
    env = {"OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20s3cret,X-Scope-OrgID=t1"}
    text = otlp_yaml(receiver.port, "    headers: {X-From-Yaml: y}\n")
    for cfg in (make_config(tmp_path, text, env), make_config(tmp_path, text)):
        tel = start_telemetry(cfg)
        try:
            calls(tel.metrics, "ns", "p", "c", 4)
            assert tel.pusher.push()
        finally:
            assert tel.shutdown()
    first, *_, last = receiver.metadata
    assert (first["authorization"], first["x-scope-orgid"]) == ("Bearer s3cret", "t1")
    assert last["x-from-yaml"] == "y"


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A collector that accepts TCP connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


def test_stop_with_a_blackholed_collector_is_bounded_and_reports_the_loss(
    tmp_path, blackhole, root_log
):
    cfg = make_config(tmp_path, otlp_yaml(blackhole))
    cfg.export.otlp.interval_seconds = 0.05  # a periodic push is in flight when we stop
    tel = start_telemetry(cfg)
    calls(tel.metrics, "ns", "p", "c", 3)
    assert tel.shutdown() is False
    lost = [r.getMessage() for r in root_log.records if "not delivered" in r.getMessage()]
    assert lost == [
        f"OTLP export to http://127.0.0.1:{blackhole}: the final counts were not delivered "
        "within 1s (export.otlp.timeout_seconds); the collector keeps the last pushed counts"
    ]


class GatedMetrics(Series):
    """A series table whose collect() takes its snapshot, then waits for the test to open the
    gate."""

    def __init__(self) -> None:
        super().__init__(FAMILIES, 300, 100)
        self.entered = threading.Event()
        self.gate = threading.Event()

    def collect(self):
        snapshot = super().collect()
        self.entered.set()
        assert self.gate.wait(30)
        return snapshot


def test_concurrent_scrapes_share_renders_but_never_get_an_older_one(tmp_path):
    port = free_port()
    metrics = GatedMetrics()
    tel = export.start(make_config(tmp_path, server_yaml(port)), metrics, StubHealth())
    bodies: dict[str, str] = {}

    def scrape_into(name: str) -> None:
        bodies[name] = scrape(port)

    first = threading.Thread(target=scrape_into, args=("first",))
    second = threading.Thread(target=scrape_into, args=("second",))
    try:
        first.start()
        assert metrics.entered.wait(30)  # the first render has taken its snapshot
        calls(metrics, "ns", "p", "c", 5)
        second.start()  # asks after the calls: it must see them
        for _ in range(3000):  # until the second request waits in the server (bounded)
            if sum(t.name.startswith("metrics_") for t in threading.enumerate()) == 2:
                break
            threading.Event().wait(0.01)
        metrics.gate.set()
        first.join()
        second.join()
    finally:
        metrics.gate.set()
        tel.shutdown()
    assert 'pod="p"' not in bodies["first"]
    assert (
        'kubenpu_ioctl_total{container="c",device="0000:03:00.0",kind="submit",'
        in (bodies["second"])
    )
    assert 'pod="p",pod_uid="",vendor="vgem"} 5.0' in bodies["second"]


# The heavy modules a start may import, each only when its config asks for what needs it.
OTLP_SIDE = ("kubenpu.export.otlp", "opentelemetry.sdk.metrics", "opentelemetry.exporter")
HEAVY = (*OTLP_SIDE, "prometheus_client", "cryptography", "bcc", "multiprocessing")


@pytest.mark.parametrize(
    ("prometheus", "otlp", "ca_file"),
    [(None, None, False), (True, True, False), (False, True, False), (True, True, True)],
)
def test_the_start_imports_only_what_its_config_uses(tmp_path, prometheus, otlp, ca_file):
    """Start-up time and RSS (docs/performance.md, "Start and imports"): prometheus_client only
    for /metrics, the OTel SDK's metrics modules and exporters only for OTLP, cryptography only
    to check a configured certificate file; BCC and multiprocessing never here (the BCC
    fallback and the loader child import them). None: the default (Prometheus, no OTLP). A
    fresh interpreter: the test process has them imported already."""
    ca = tmp_path / "ca.pem"
    ca.write_text("read and checked, not used: the endpoint is http\n")
    prom = f"{{port: {free_port()}" + ("" if prometheus is None else f", enabled: {prometheus}")
    yaml = f"export:\n  prometheus: {prom}}}\n"
    if otlp is not None:
        yaml += f"  otlp: {{enabled: {otlp}" + (f", certificate: {ca}}}\n" if ca_file else "}\n")
    (tmp_path / "kubenpu.yaml").write_text(yaml)
    script = f"""
import sys
from kubenpu import agent, config, export
from kubenpu.agent.health import Health
from kubenpu.sources.registry import table
cfg = config.load({str(tmp_path / "kubenpu.yaml")!r}, {{"K8S_NODE_NAME": "n"}})
export.start(cfg, table(60, 100), Health(15)).shutdown()
print(sorted({{h for h in {HEAVY!r} for m in sys.modules if m == h or m.startswith(h + ".")}}))
"""
    # No tests/helpers.py in the script: it imports prometheus_client for the VM tests.
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    want = {"prometheus_client"} if prometheus is not False else set()
    want |= set(OTLP_SIDE) if otlp else set()
    want |= {"cryptography"} if ca_file else set()
    assert out.stdout.split("\n")[-2] == str(sorted(want))


# --- values the wire cannot carry, and pushes larger than a receiver takes ----------------


@pytest.fixture(params=["grpc", "http/protobuf"])
def any_receiver(request: pytest.FixtureRequest) -> Iterator[tuple[str, OtlpReceiver]]:
    """A real receiver of each protocol, both refusing requests over 4 MiB."""
    with OtlpReceiver() if request.param == "grpc" else OtlpHttpReceiver() as rx:
        yield request.param, rx


def start_pushing(
    tmp_path: Path, protocol: str, port: int, extra: str = "", timeout: float = 1
) -> export.Exporters:
    cfg = make_config(tmp_path, otlp_yaml(port, f"    protocol: {protocol}\n{extra}"))
    cfg.export.otlp.timeout_seconds = timeout
    return start_telemetry(cfg)


CYCLES_WHERE = Where("ns", "p", "", "c", "0000:03:00.0", "xe")


def test_gzip_shrinks_a_push_and_the_config_wins_over_the_exporters_own_env(
    tmp_path, any_receiver, monkeypatch
):
    """export.otlp.compression reaches the wire: 100 pods' calls go in a fraction of the bytes
    gzipped, and exactly. The exporter reads OTEL_EXPORTER_OTLP_COMPRESSION itself when given
    no compression: set to the opposite, it must change nothing."""
    protocol, rx = any_receiver
    sent = {}
    for compression, env in (("none", "gzip"), ("gzip", "none")):
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", env)  # os.environ: the SDK's
        with Relay(rx.port) as relay:
            extra = f"    compression: {compression}\n"
            tel = start_pushing(tmp_path, protocol, relay.port, extra)
            try:
                for pod in range(100):
                    calls(tel.metrics, "ns", f"pod-{pod}", "c", pod + 1)
                assert tel.pusher.push()
            finally:
                tel.shutdown()
        want = {ioctl("ns", f"pod-{pod}", "c"): pod + 1 for pod in range(100)}
        assert rx.values("kubenpu.ioctl") == want
        sent[compression] = relay.sent
    assert sent["gzip"] * 3 < sent["none"], sent


def test_a_counter_past_int64_is_pushed_as_a_double(tmp_path, any_receiver):
    """Two clients' cycle counters near 2^63 sum past OTLP's int64: the gRPC push thread died
    on the encoding error, and every HTTP push failed while the pod lived."""
    protocol, rx = any_receiver
    tel = start_pushing(tmp_path, protocol, rx.port)
    try:
        for _ in range(2):
            assert tel.metrics.put(ENGINES[ENGINE_CYCLES], CYCLES_WHERE, "rcs", 2**63 - 1)
        calls(tel.metrics, "ns", "p", "c", 3)
        assert tel.pusher.push()
        assert tel.pusher.push()  # and the next one
    finally:
        tel.shutdown()
    [cycles] = rx.values("kubenpu.engine.cycles").values()
    assert cycles == float(2**64 - 2)
    assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 3}
    assert rx.values("kubenpu.otlp.export.errors") == {frozenset(): 0}


def test_an_increment_past_a_double_is_skipped_at_the_edge_and_pushes_go_on(tmp_path, any_receiver):
    """A counter above ~1e308 (an int no double holds, or a float sum that became inf) failed
    every push and every scrape while the pod lived. The table refuses such an increment (put
    is False; the caller counts it in kubenpu_fdinfo_skipped_total{reason="out_of_range"}:
    tests/test_usage.py) and keeps the sum it had."""
    protocol, rx = any_receiver
    cfg = make_config(tmp_path, otlp_yaml(rx.port, f"    protocol: {protocol}\n"))
    cfg.export.prometheus.enabled = True
    tel = start_telemetry(cfg)
    cycles, busy = ENGINES[ENGINE_CYCLES], ENGINES[ENGINE_BUSY]
    try:
        assert not tel.metrics.put(cycles, CYCLES_WHERE, "rcs", 10**400)  # > any double
        assert tel.metrics.put(busy, CYCLES_WHERE, "rcs", 1e308)
        assert not tel.metrics.put(busy, CYCLES_WHERE, "rcs", 1e308)  # the sum: inf
        calls(tel.metrics, "ns", "p", "c", 3)
        assert tel.pusher.push()
        assert 'kubenpu_engine_busy_seconds_total{container="c"' in scrape(tel.server.port)
    finally:
        tel.shutdown()
    assert values(tel.metrics, ENGINE_CYCLES) == {}  # the refused row was never made
    assert list(rx.values("kubenpu.engine.busy").values()) == [1e308]
    assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 3}
    assert rx.values("kubenpu.otlp.export.errors") == {frozenset(): 0}


def test_an_encoding_failure_is_a_counted_export_error_and_the_next_push_goes_out(
    tmp_path, any_receiver, root_log, monkeypatch
):
    """The edge keeps such values out (above); planted past it, an encoding failure must fail
    one push, counted and logged, while that push's other requests and the next push go out.
    (Planted by wrapping Series.collect: nothing real can make such a value any more.)"""
    protocol, rx = any_receiver
    tel = start_pushing(tmp_path, protocol, rx.port, "    max_request_bytes: 65536\n", 60)
    for i in range(1000):
        calls(tel.metrics, "ns", f"p{i}", "c", 1)
    collect = tel.metrics.collect
    planted = [Point(dict(CYCLES_WHERE._asdict(), engine="rcs"), 10**400, 0)]
    poisoned = iter([[(ENGINE_CYCLES, planted), *collect()]])  # in the first request
    monkeypatch.setattr(tel.metrics, "collect", lambda: next(poisoned, None) or collect())
    try:
        assert not tel.pusher.push()
        assert len(rx.requests) > 1  # the batches without the value went out
        assert len(rx.values("kubenpu.ioctl", 0)) > 0
        sent = len(rx.requests)
        assert tel.pusher.push()
        assert len(rx.requests) > sent
    finally:
        tel.shutdown()
    assert values_of(tel.metrics, EXPORT_ERRORS) == 1
    lines = [r.getMessage() for r in root_log.records if r.name == "kubenpu.export.otlp"]
    assert "failed (1 in a row): cannot encode the push: OverflowError" in lines[0]


def values_of(metrics: Series, spec: Spec) -> float:
    return sum(p.value for p in dict(metrics.collect())[spec])  # type: ignore[misc]


def test_a_large_push_is_split_into_requests_the_receiver_takes(tmp_path, any_receiver):
    """At 20,000 series one push was 5.18 MB and every gRPC push failed RESOURCE_EXHAUSTED.
    (`make bench` pushes 100,000: bench/stress.py, which also says whether each arrived.)"""
    series = 20_000
    protocol, rx = any_receiver
    extra = f"metrics: {{max_series: {series}}}\n"
    tel = start_pushing(tmp_path, protocol, rx.port, extra, timeout=120)
    try:
        for i in range(series):
            calls(tel.metrics, "namespace-0", f"pod-{i:06d}", "container", i + 1)
        assert tel.pusher.push()
    finally:
        tel.shutdown()
    sizes = [r.ByteSize() for r in rx.requests]
    limit = config.OtlpConfig().max_request_bytes
    assert max(sizes) <= limit < 4 << 20
    delivered: dict[str, float] = {}
    for i in range(len(rx.requests)):
        for _, metric in rx.metrics(i):
            if metric.name == "kubenpu.ioctl":
                for p in metric.sum.data_points:
                    delivered[attrs(p.attributes)["k8s.pod.name"]] = p.as_int
    assert len(delivered) == series
    assert sum(delivered.values()) == series * (series + 1) // 2


def test_the_connection_cap_leaves_descriptors_below_the_limit_after_raising_it():
    """The server held up to 4,096 connections whatever the limit, and the agent never raised
    its soft limit: at 1,024 with ~1,100 idle connections a cgroup walk failed with EMFILE."""
    script = """
import resource
from kubenpu.agent import raise_nofile
from kubenpu.export.server import max_open
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
low = max_open()
print(low, raise_nofile() == hard == resource.getrlimit(resource.RLIMIT_NOFILE)[0], max_open())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    low, raised, high = out.stdout.split()
    assert (int(low), raised) == (512, "True")
    assert int(high) > 512 or resource.getrlimit(resource.RLIMIT_NOFILE)[1] <= 1024


def test_probes_are_answered_while_idle_connections_fill_the_cap(tmp_path, monkeypatch):
    """6,000 idle connections held for 60 s made 8 of 17 /healthz probes time out: a probe
    waited in the backlog until an idle connection's read timeout freed a slot."""
    monkeypatch.setattr(export.server, "max_open", lambda: 8)
    port = free_port()
    extra = "    read_timeout_seconds: 300\n"  # idle ones are not dropped by their timeout
    tel = start_telemetry(make_config(tmp_path, server_yaml(port, extra)))
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(50)]
    try:
        for _ in range(3):
            assert get(port, "/healthz")[:2] == (200, "ok\n")
        assert "kubenpu_events_received_total" in scrape(port)
    finally:
        for s in idle:
            s.close()
        tel.shutdown()


# --- pod attributes: the OTel semantic conventions (docs/metrics.md, Pod attributes on OTLP)

# Each k8s.* attribute a per-pod point carries: our label, the attribute, and the spec that
# defines it (open-telemetry/semantic-conventions; the stable names are also the SDK's
# opentelemetry.semconv.attributes.k8s_attributes, generated from that file).
SEMCONV = [
    ("namespace", k8s_attributes.K8S_NAMESPACE_NAME, "model/k8s/registry.yaml"),
    ("pod", k8s_attributes.K8S_POD_NAME, "model/k8s/registry.yaml"),
    ("pod_uid", k8s_attributes.K8S_POD_UID, "model/k8s/registry.yaml"),
    ("container", k8s_attributes.K8S_CONTAINER_NAME, "model/k8s/registry.yaml"),
]
# The per-pod series of an Attribution; the allocation series carry the uid too, but one per pod
# name, the running pod's (tests/test_allocations.py), so two pods of one name are not theirs.
ALLOCATION_SPECS = (ALLOCATED, ALLOCATED_IDLE, ALLOCATED_IDLE_FOR, UNALLOCATED_CALLS)
POD_SPECS = [
    spec for spec in SPECS if set(POD_LABELS) <= set(spec.labels) and spec not in ALLOCATION_SPECS
]
UID_A, UID_B = "8f2c3a10-0000-4000-8000-00000000000a", "8f2c3a10-0000-4000-8000-00000000000b"


def push_pods(tmp_path: Path, rx: OtlpReceiver, attributes: str) -> None:
    """Two pods of one name, one after the other (uids a, b), with calls, their durations and
    errors, engine time, memory, capacity, energy and GPU jobs: every per-pod series the table makes
    from an Attribution."""
    text = otlp_yaml(rx.port, f"    attributes: {attributes}\n")
    tel = start_telemetry(make_config(tmp_path, text))
    try:
        m = tel.metrics
        capacity, memory = {}, {}
        for uid, n in ((UID_A, 2), (UID_B, 3)):
            calls(m, "ns", "p", "c", n, uid=uid)
            where = Where("ns", "p", uid, "c", "0000:03:00.0", "vgem")
            for spec in ENGINE_COUNTERS:
                m.put(ENGINES[spec], where, "render", n)
            m.put(POD_ENERGY_SHARES, where, "", n * 1_000_000)
            slots = (n,) + (0,) * (abi.DURATION_SLOTS - 1)
            errors = (n,) + (0,) * (len(abi.ERRORS) - 1)
            m.put(DURATIONS, where, "submit", (Key(n, 226, 0, 1), Durations(n, slots, errors)))
            m.put(REMOTE, where, "submit", (Key(n, 226, 0, 1), n - 1))
            histogram = Durations(n, slots, ())
            m.put(JOB_TIMES, where, "gfx_0.0.0", (n, JobTimes(n + 1, n, histogram, histogram)))
            m.put(RESETS[POD_HANGS], where, "", 1)
            m.put(RESETS[RESET_VICTIMS], where, "", 1)
            m.put(BEHIND, where, "gfx_0.0.0\nns\np", n)
            m.put(IDLE, where, "gfx_0.0.0", n)
            capacity[(where, "render")] = 1
            memory[(where, "vram0", "resident")] = n
        m.set(GAUGES, "", (capacity, memory))
        assert tel.pusher.push()
    finally:
        tel.shutdown()


def points(rx: OtlpReceiver, name: str) -> list[dict[str, object]]:
    metric = rx.metric(name)
    data = getattr(metric, metric.WhichOneof("data")).data_points
    return [attrs(p.attributes) for p in data]


def test_the_semconv_table_is_the_catalogues_and_names_stable_attributes():
    assert {ours: theirs for ours, theirs, _ in SEMCONV} == K8S_ATTRIBUTES
    assert set(POD_LABELS) == set(K8S_ATTRIBUTES)
    assert all(spec.endswith("registry.yaml") for _, _, spec in SEMCONV)
    assert {s.name for s in POD_SPECS} >= {"kubenpu.ioctl", "kubenpu.energy", "kubenpu.memory"}


def test_per_pod_points_carry_exactly_the_k8s_attributes_and_the_uid_parts_two_pods(
    tmp_path, receiver
):
    push_pods(tmp_path, receiver, "semconv")
    k8s = {theirs for _, theirs, _ in SEMCONV}
    for spec in POD_SPECS:
        got = points(receiver, spec.name)
        own = set(spec.labels) - set(POD_LABELS)
        assert [set(p) for p in got] == [k8s | own] * len(got), spec.name
        # Same namespace, pod and container names: k8s.pod.uid makes them two series.
        assert sorted(p["k8s.pod.uid"] for p in got) == [UID_A, UID_B], spec.name
        assert {(p["k8s.namespace.name"], p["k8s.pod.name"]) for p in got} == {("ns", "p")}
    assert receiver.values("kubenpu.ioctl") == {
        ioctl("ns", "p", "c", uid=UID_A): 2,
        ioctl("ns", "p", "c", uid=UID_B): 3,
    }


def test_points_without_a_pod_leave_the_k8s_attributes_off(tmp_path, receiver):
    """A host process's calls name no pod, and a container started with ctr no pod either: its
    points carry only the k8s.* attributes that have a value, never an empty k8s.pod.name."""
    tel = start_telemetry(make_config(tmp_path, otlp_yaml(receiver.port)))
    try:
        calls(tel.metrics, "", "", "", 5)  # a host process
        calls(tel.metrics, "default", "", "", 2)  # ctr's namespace, no pod or container name
        calls(tel.metrics, "ns", "p", "c", 1, uid=UID_A)
        assert tel.pusher.push()
    finally:
        tel.shutdown()
    got = {frozenset(p.items()) for p in points(receiver, "kubenpu.ioctl")}
    own = {("device", "0000:03:00.0"), ("vendor", "vgem"), ("kind", "submit")}
    assert got == {
        frozenset(own),
        frozenset(own | {("k8s.namespace.name", "default")}),
        frozenset(own | {*zip(K8S_ATTRIBUTES.values(), ("ns", "p", UID_A, "c"), strict=True)}),
    }


@pytest.mark.parametrize("attributes", ["semconv", "legacy"])
def test_requests_name_the_conventions_version_their_names_follow(tmp_path, receiver, attributes):
    """semconv names: each resource and scope says which conventions (schema_url), one that
    the conventions published; legacy names follow none, so none."""
    push_pods(tmp_path, receiver, attributes)
    want = SCHEMA_URL if attributes == "semconv" else ""
    assert receiver.requests
    for request in receiver.requests:
        for rm in request.resource_metrics:
            assert rm.schema_url == want
            assert [sm.schema_url for sm in rm.scope_metrics] == [want]
    assert SCHEMA_URL in {s.value for s in Schemas}


def test_legacy_attributes_are_the_old_names_without_the_uid(tmp_path, receiver):
    push_pods(tmp_path, receiver, "legacy")
    for spec in POD_SPECS:
        got = points(receiver, spec.name)
        assert [set(p) for p in got] == [set(spec.labels) - {"pod_uid"}] * len(got), spec.name
    # Without the uid the two pods are one series again, as before: their calls add up.
    [(key, n)] = receiver.values("kubenpu.ioctl").items()
    assert n == 5 and dict(key)["pod"] == "p"
    [timed] = receiver.metric("kubenpu.ioctl.duration").exponential_histogram.data_points
    assert (timed.zero_count, timed.count, timed.sum) == (5, 5, 5e-9)  # bucket by bucket


def test_the_vm_tests_projections_of_a_push_and_a_scrape_agree(tmp_path, receiver):
    """otlp_counts() (a guest's OTLP points) and ioctl_counts() (its /metrics) key one series
    alike: the VM tests compare both with the same expected counts."""
    port = free_port()
    text = otlp_yaml(receiver.port).replace(
        "{enabled: false}", f"{{host: 127.0.0.1, port: {port}}}"
    )
    tel = start_telemetry(make_config(tmp_path, text))
    try:
        calls(tel.metrics, "ns", "p", "c", 42, uid=UID_A)
        assert tel.pusher.push()
        samples = parse(scrape(port))
    finally:
        tel.shutdown()
    pushed = [
        {"attributes": dict(a), "value": v} for a, v in receiver.values("kubenpu.ioctl").items()
    ]
    want = {("ns", "p", "c", "0000:03:00.0", "vgem", "submit"): 42}
    assert otlp_counts(pushed) == ioctl_counts(samples) == want


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_mutual_tls_sends_the_client_certificate_and_the_headers(
    tmp_path, tls_files, protocol, monkeypatch
):
    """export.otlp.client_key and client_certificate reach each protocol's exporter: a receiver
    that requires a client certificate signed by the CA takes the push, with its headers; the
    same agent without them is refused. The node's image may set REQUESTS_CA_BUNDLE, which
    requests took over the session's CA: every HTTP push failed verification."""
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    tls = (tls_files["server.pem"].read_bytes(), tls_files["server.key"].read_bytes())
    ca = tls_files["ca.pem"].read_bytes()
    receivers = {"grpc": OtlpReceiver, "http/protobuf": OtlpHttpReceiver}
    client = (
        f"    client_key: {tls_files['client.key']}\n"
        f"    client_certificate: {tls_files['client.pem']}\n"
    )
    for files, delivered in ((client, True), ("", False)):
        with receivers[protocol](tls=tls, client_ca=ca) as rx:
            extra = (
                f"    protocol: {protocol}\n    certificate: {tls_files['ca.pem']}\n"
                f"    headers: {{x-tenant: t1}}\n{files}"
            )
            cfg = make_config(tmp_path, otlp_yaml(rx.port, extra).replace("http://", "https://"))
            tel = start_telemetry(cfg)
            try:
                calls(tel.metrics, "ns", "p", "c", 3)
                assert tel.pusher.push() is delivered
            finally:
                tel.shutdown()
            if delivered:
                assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 3}
                assert rx.metadata[-1]["x-tenant"] == "t1"
            else:
                assert rx.requests == []


@pytest.mark.parametrize("key", ["certificate", "client_key", "client_certificate"])
def test_an_otlp_tls_file_that_is_a_directory_is_named_in_the_error(tmp_path, key):
    cfg = make_config(
        tmp_path,
        otlp_yaml(4317, f"    {key}: {tmp_path}\n"),
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317"},
    )
    with pytest.raises(export.ExportError, match=rf"^cannot read export\.otlp\.{key} {tmp_path}"):
        start_telemetry(cfg)


# --- the pusher's lines, deadline and stop (from mutmut's survivors) ---------------------------


def test_failed_pushes_and_the_recovery_are_one_line_each(tmp_path, receiver, root_log):
    port = receiver.port
    receiver.stop()
    tel = start_telemetry(make_config(tmp_path, otlp_yaml(port)))
    url = f"http://127.0.0.1:{port}"
    root_log.records.clear()
    try:
        calls(tel.metrics, "ns", "p", "c", 1)
        assert not tel.pusher.push() and not tel.pusher.push()
        with OtlpReceiver(port=port):
            assert delivered(tel)
            assert tel.pusher.push()  # delivered again: nothing to say
            said = [r.getMessage() for r in root_log.records if r.name == "kubenpu.export.otlp"]
    finally:
        tel.shutdown()
    *failed, recovered = said  # 2, or more while the channel reconnects (delivered() retries)
    assert len(failed) >= 2
    for n, line in enumerate(failed, 1):
        assert line.startswith(f"OTLP export to {url} failed ({n} in a row): "), line
        assert line.endswith("; next try in 3600s, counts are cumulative"), line
    assert recovered == f"OTLP export to {url} recovered after {len(failed)} failed pushes"


class _Clock:
    """time.monotonic for the pusher: each reading `step` seconds after the one before."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now - self.step


def test_a_push_gives_each_request_what_is_left_of_one_timeout(tmp_path, receiver, monkeypatch):
    """Batches share export.otlp.timeout_seconds (1 s): each export() is given what is left of
    it (the SDK's exporters, 1.45, bound a request by their own timeout instead:
    test_a_request_is_bounded_by_the_configured_timeout), and a batch that finds none left ends
    the push, said, not sent."""
    tel = start_pushing(tmp_path, "grpc", receiver.port, "    max_request_bytes: 65536\n")
    timeouts: list[float] = []
    export_ = tel.pusher._exporter.export

    def recorded(data, timeout_millis):  # type: ignore[no-untyped-def]
        timeouts.append(timeout_millis)
        return export_(data, timeout_millis=timeout_millis)

    monkeypatch.setattr(tel.pusher._exporter, "export", recorded)
    try:
        for i in range(2000):  # more than 4 requests of at most 64 KiB
            calls(tel.metrics, "ns", f"p{i}", "c", 1)
        clock = SimpleNamespace(monotonic=_Clock(0.25), time_ns=time.time_ns)
        monkeypatch.setattr(otlp, "time", clock)  # the pusher's clock alone
        assert not tel.pusher.push()
    finally:
        monkeypatch.undo()
        tel.shutdown()
    # The deadline is read at 0 s (1 s), the batches at 0.25 s and 0.5 s; the third finds 0 s.
    assert timeouts == [750.0, 500.0, 250.0]


def test_a_stop_whose_final_push_fails_reports_the_loss_and_restores_the_exporters_log(
    tmp_path, receiver, root_log
):
    port = receiver.port
    receiver.stop()
    tel = start_telemetry(make_config(tmp_path, otlp_yaml(port)))
    exporter_log = logging.getLogger("opentelemetry.exporter.otlp")
    assert exporter_log.propagate is False  # the pusher quotes the exporters' words instead
    assert tel.pusher._thread.name == "otlp-push" and tel.pusher._thread.daemon
    calls(tel.metrics, "ns", "p", "c", 1)
    assert not tel.pusher.shutdown()  # refused at once: the thread ended, nothing delivered
    assert any("the final counts were not delivered" in r.getMessage() for r in root_log.records)
    assert exporter_log.propagate is True and tel.pusher._last not in exporter_log.handlers
    tel.shutdown()


def test_a_request_is_bounded_by_the_configured_timeout(tmp_path, any_receiver, root_log):
    """The SDK exporters bound a request by the timeout they were built with (export() takes no
    deadline of its own), so export.otlp.timeout_seconds (1 s) must reach them: a collector
    that answers after 3 s fails the push, where the SDK's default of 10 s would wait for it."""
    protocol, rx = any_receiver
    rx.answer_after = 3
    tel = start_pushing(tmp_path, protocol, rx.port)
    try:
        calls(tel.metrics, "ns", "p", "c", 1)
        assert not tel.pusher.push()
    finally:
        rx.answer_after = 0
        tel.shutdown()
    [line] = [r.getMessage() for r in root_log.records if "failed (1 in a row)" in r.getMessage()]
    assert ("DEADLINE_EXCEEDED" if protocol == "grpc" else "due to timeout") in line, line


def test_the_exporter_reads_no_otel_variable_of_its_own(tmp_path, receiver, monkeypatch):
    """kubenpu.config applies the OTEL_* variables; one set after it (as the node's image may
    set OTEL_EXPORTER_OTLP_INSECURE=false for other processes) must not make the exporter
    choose TLS for a plaintext endpoint the config resolved."""
    cfg = make_config(tmp_path, otlp_yaml(receiver.port))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "false")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    tel = start_telemetry(cfg)
    try:
        calls(tel.metrics, "ns", "p", "c", 2)
        assert delivered(tel)
    finally:
        tel.shutdown()
    assert receiver.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 2}


def test_an_https_push_without_a_certificate_verifies_with_the_images_ca_bundle(
    tmp_path, tls_files, monkeypatch
):
    """Only export.otlp.certificate overrides REQUESTS_CA_BUNDLE: without it, the node image's
    CA bundle is the trust an HTTPS push verifies with, as for any requests client."""
    for var in ("OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls_files["ca.pem"]))
    tls = (tls_files["server.pem"].read_bytes(), tls_files["server.key"].read_bytes())
    with OtlpHttpReceiver(tls=tls) as rx:
        text = otlp_yaml(rx.port, "    protocol: http/protobuf\n").replace("http://", "https://")
        assert push_calls(make_config(tmp_path, text), 4)
        assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 4}


def failed_push(tel: export.Exporters, root_log: Records, monkeypatch: pytest.MonkeyPatch) -> str:
    """One push of one call that must fail (the test patched what fails it): its log line,
    after the patches are undone and the exporters stopped; the failure is counted."""
    try:
        calls(tel.metrics, "ns", "p", "c", 1)
        assert tel.pusher.push() is False
        monkeypatch.undo()
        assert dict(tel.metrics.collect())[EXPORT_ERRORS][0].value == 1
    finally:
        monkeypatch.undo()
        tel.shutdown()
    [line] = [r.getMessage() for r in root_log.records if "failed (1 in a row)" in r.getMessage()]
    return line.split(": ", 1)[1]


def test_a_snapshot_that_fails_is_a_failed_push_that_says_why(
    tmp_path, receiver, root_log, monkeypatch
):
    tel = start_telemetry(make_config(tmp_path, otlp_yaml(receiver.port)))

    def broken() -> None:
        raise ValueError("no snapshot")

    monkeypatch.setattr(tel.metrics, "collect", broken)
    assert failed_push(tel, root_log, monkeypatch) == (
        "cannot encode the push: ValueError: no snapshot; next try in 3600s, counts are cumulative"
    )


def test_a_refusal_without_a_word_from_the_exporter_says_unknown_error(
    tmp_path, receiver, root_log, monkeypatch
):
    tel = start_telemetry(make_config(tmp_path, otlp_yaml(receiver.port)))

    def refuse(*args: object, **kwargs: object) -> otlp.MetricExportResult:
        return otlp.MetricExportResult.FAILURE  # and no warning logged, as some failures are

    monkeypatch.setattr(tel.pusher._exporter, "export", refuse)
    assert failed_push(tel, root_log, monkeypatch).startswith("unknown error; next try in")


def test_a_final_push_that_never_returns_does_not_hold_the_stop(tmp_path, receiver, monkeypatch):
    """shutdown() waits for the push thread at most export.otlp.timeout_seconds, whatever the
    exporter does: here its export blocks until the test lets it go, after the stop."""
    tel = start_telemetry(make_config(tmp_path, otlp_yaml(receiver.port)))
    release = threading.Event()

    def export_(*args: object, **kwargs: object) -> otlp.MetricExportResult:
        release.wait(10)  # then delivered: a stop that waited for it would say so
        return otlp.MetricExportResult.SUCCESS

    monkeypatch.setattr(tel.pusher._exporter, "export", export_)
    try:
        calls(tel.metrics, "ns", "p", "c", 1)
        assert tel.pusher.shutdown() is False
    finally:
        release.set()
        monkeypatch.undo()
        tel.shutdown()


class GzipBomb(BaseHTTPRequestHandler):
    """A collector that answers every push 200 with a gzip body: a few KB that inflate to
    `inflated` bytes of zeros, sent until the client closes."""

    inflated = 64 << 20
    sent: int = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Encoding", "gzip")
        self.end_headers()  # HTTP/1.0: the body ends at the close
        deflate, zeros = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20)
        try:
            for _ in range(self.inflated // len(zeros)):
                self.wfile.write(deflate.compress(zeros))
            self.wfile.write(deflate.flush())
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading
            pass

    def log_message(self, *args: object) -> None:
        pass


def test_a_collectors_answer_is_read_up_to_its_bound_only(tmp_path, root_log, monkeypatch) -> None:
    """A 64 KB gzip answer inflating to 64 MiB (1 GB made the agent's RSS 67 -> 991 MB): the
    push fails at the bound, and says so."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), GzipBomb)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tel = start_pushing(tmp_path, "http/protobuf", server.server_address[1])
        why = failed_push(tel, root_log, monkeypatch)
    finally:
        server.shutdown()
        server.server_close()
    assert f"the collector's answer is larger than {otlp.MAX_ANSWER_BYTES} bytes" in why


def test_a_bounded_read_stops_one_byte_past_the_bound() -> None:
    """An endless stream: read_at_most asks it for the bound and one byte more, no further."""
    served = []

    def endless(n: int) -> bytes:
        served.append(n)
        return bytes(n)

    with pytest.raises(ValueError, match="the answer is larger than 100000 bytes"):
        read_at_most(endless, 100_000, "the answer")
    assert sum(served) == 100_001
    exact = io.BytesIO(bytes(100_000))
    assert read_at_most(exact.read, 100_000, "the answer") == bytes(100_000)
