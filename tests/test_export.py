"""kubenpu.export over OTLP/gRPC (a real grpcio receiver) and /metrics (a real HTTP server)."""

from __future__ import annotations

import logging
import socket
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from otlp_receiver import OtlpReceiver, attrs
from test_metrics import Clock, calls, ioctl

from kubenpu import __version__, config, export
from kubenpu.metrics import EXPORT_ERRORS, OVERFLOW_ATTRS, DeviceRow

HOUR = 3600.0  # an interval long enough that only explicit flushes push


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_config(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> config.Config:
    p = tmp_path / "kubenpu.yaml"
    p.write_text(text)
    return config.load(str(p), {"K8S_NODE_NAME": "node-a", **(env or {})})


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


def test_grpc_push_exact_values_resource_and_headers(tmp_path, receiver, clean_resource_env):
    cfg = make_config(tmp_path, otlp_yaml(receiver.port, "    headers: {x-tenant: t1}\n"))
    tel = export.start(cfg)
    try:
        m = tel.metrics
        calls(m, "ns", "p", "c", 41)
        calls(m, "ns", "p", "c", 1)
        calls(m, "", "", "", 5)
        m.unattributed("not_indexed", 5)
        m.set_devices([DeviceRow("0000:03:00.0", "vgem", "vgem", "1af4:1050", "1")])
        assert tel.flush()
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
    assert resource["host.name"] == socket.gethostname()
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


def delivered(tel: export.Telemetry, attempts: int = 3) -> bool:
    """Push until one push is delivered, as the timer would. Right after the collector comes
    back, gRPC may still be in its reconnect backoff, so the first push can fail."""
    return any(tel.flush() for _ in range(attempts))


def test_collector_down_at_start_and_mid_run_loses_nothing(tmp_path, receiver, root_log):
    port = receiver.port
    receiver.stop()  # down at start
    cfg = make_config(tmp_path, otlp_yaml(port))
    cfg.export.otlp.timeout_seconds = 3  # room for the exporter's own retry after a reconnect
    tel = export.start(cfg)
    try:
        calls(tel.metrics, "ns", "p", "c", 10)
        assert not tel.flush()
        # One line per failed push, none from the OTel exporter itself.
        assert [r.name for r in root_log.records] == ["kubenpu.export"]
        assert "failed (1 in a row)" in root_log.records[0].getMessage()
        assert "UNAVAILABLE" in root_log.records[0].getMessage()
        with OtlpReceiver(port=port) as rx:  # the collector comes up
            calls(tel.metrics, "ns", "p", "c", 5)
            assert delivered(tel)
            assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 15}
        calls(tel.metrics, "ns", "p", "c", 7)  # ...goes down mid-run...
        assert not tel.flush()
        assert not tel.flush()
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
    tel = export.start(cfg)
    calls(tel.metrics, "ns", "p", "c", 3)
    tel.shutdown()  # joins the timer thread, then makes the final push
    assert len(receiver.requests) >= 1
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
    return {name: d / name for name in ("ca.pem", "server.pem", "server.key")}


def test_grpc_tls_with_ca_certificate_from_env(tmp_path, tls_files):
    tls = (tls_files["server.pem"].read_bytes(), tls_files["server.key"].read_bytes())
    with OtlpReceiver(tls=tls) as rx:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rx.port}",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(tls_files["ca.pem"]),
            "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20s3cret",
        }
        tel = export.start(make_config(tmp_path, otlp_yaml(0), env))
        try:
            calls(tel.metrics, "ns", "p", "c", 9)
            assert tel.flush()
        finally:
            tel.shutdown()
        assert rx.values("kubenpu.ioctl") == {ioctl("ns", "p", "c"): 9}
        assert rx.metadata[-1]["authorization"] == "Bearer s3cret"
    # Without the CA the server is not trusted: the push fails, it does not crash.
    with OtlpReceiver(tls=tls) as rx:
        tel = export.start(
            make_config(
                tmp_path,
                otlp_yaml(0),
                {"OTEL_EXPORTER_OTLP_ENDPOINT": f"https://127.0.0.1:{rx.port}"},
            )
        )
        try:
            assert not tel.flush()
        finally:
            tel.shutdown()
        assert rx.requests == []


def test_unreadable_certificate_is_a_clear_error(tmp_path):
    cfg = make_config(
        tmp_path,
        otlp_yaml(4317, "    certificate: /nonexistent/ca.pem\n"),
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://127.0.0.1:4317"},
    )
    with pytest.raises(export.ExportError, match=r"cannot read OTLP TLS file /nonexistent/ca\.pem"):
        export.start(cfg)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def prom_yaml(port: int) -> str:
    return f"export: {{prometheus: {{host: 127.0.0.1, port: {port}}}}}\n"


def test_metrics_port_in_use_is_a_specific_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(export.PortInUseError) as err:
            export.start(make_config(tmp_path, prom_yaml(port)))
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
    tel = export.start(make_config(tmp_path, text), clock=clock)
    try:
        calls(tel.metrics, "ns", "gone", "c", 2)
        calls(tel.metrics, "ns", "stays", "c", 3)
        assert tel.flush()
        assert 'pod="gone"' in scrape(port)
        tel.metrics.container_gone("ns", "gone", "c")
        clock.now += 60
        body = scrape(port)
        assert 'pod="gone"' not in body
        assert 'pod="stays"' in body
        assert tel.flush()
        assert receiver.values("kubenpu.ioctl") == {ioctl("ns", "stays", "c"): 3}
    finally:
        tel.shutdown()


def test_overflow_series_on_both_paths(tmp_path, receiver):
    port = free_port()
    text = otlp_yaml(receiver.port).replace(
        "{enabled: false}", f"{{host: 127.0.0.1, port: {port}}}"
    )
    tel = export.start(make_config(tmp_path, text + "metrics: {max_series: 1}\n"))
    try:
        calls(tel.metrics, "ns", "a", "c", 2)
        calls(tel.metrics, "ns", "b", "c", 3)
        calls(tel.metrics, "ns", "d", "c", 4)
        assert tel.flush()
        assert 'kubenpu_ioctl_total{otel_metric_overflow="true"} 7.0' in scrape(port)
    finally:
        tel.shutdown()
    got = receiver.values("kubenpu.ioctl")
    assert got == {ioctl("ns", "a", "c"): 2, frozenset(OVERFLOW_ATTRS.items()): 7}
    assert receiver.values("kubenpu.overflow_calls") == {frozenset(): 7}
    point = receiver.metric("kubenpu.ioctl").sum.data_points[-1]
    assert attrs(point.attributes) == {"otel.metric.overflow": True}
