"""The device telemetry's OTLP payload against the OpenTelemetry hardware semantic conventions
(open-telemetry/semantic-conventions, model/hardware/, as of 2026-08): each row below is one
metric of the conventions, copied from the file it names; the test pushes the fixture machines'
telemetry to a real OTLP receiver and checks every point of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import pytest
from helpers import make_config, start_telemetry
from otlp_receiver import OtlpReceiver, attrs

from kubenpu.discovery import discover
from kubenpu.metrics.catalogue import HW_DESCRIPTIVE, SPECS
from kubenpu.metrics.series import Series
from kubenpu.sources.telemetry import Telemetry

TESTDATA = Path(__file__).parent / "testdata"
MACHINES = ("intel-arc-xe", "amd-server", "intel-npu", "gaudi")


class Convention(NamedTuple):
    name: str
    instrument: str  # counter, updowncounter, gauge
    unit: str
    value_type: str  # metric_value_type: int or double
    required: tuple[str, ...]  # hw.id is every metric's (hardware.attributes.common)
    source: str  # model/hardware/<file>


CONVENTIONS = [
    Convention("hw.energy", "counter", "J", "double", ("hw.type",), "common-metrics.yaml"),
    Convention(
        "hw.errors", "counter", "{error}", "int", ("hw.type", "error.type"), "common-metrics.yaml"
    ),
    Convention("hw.power", "gauge", "W", "double", ("hw.type",), "common-metrics.yaml"),
    Convention(
        "hw.status", "updowncounter", "1", "int", ("hw.type", "hw.state"), "common-metrics.yaml"
    ),
    Convention("hw.temperature", "gauge", "Cel", "double", (), "temperature-metrics.yaml"),
    Convention("hw.temperature.limit", "gauge", "Cel", "double", (), "temperature-metrics.yaml"),
    Convention("hw.voltage", "gauge", "V", "double", (), "voltage-metrics.yaml"),
    Convention("hw.gpu.memory.limit", "updowncounter", "By", "int", (), "gpu-metrics.yaml"),
    Convention("hw.gpu.memory.usage", "updowncounter", "By", "int", (), "gpu-metrics.yaml"),
    Convention("hw.gpu.memory.utilization", "gauge", "1", "double", (), "gpu-metrics.yaml"),
    Convention("hw.gpu.utilization", "gauge", "1", "double", (), "gpu-metrics.yaml"),
]
# registry.yaml's enums. Semconv allows a value of one's own where none fits: hw.type npu (no
# NPU type yet), limit types rated_max (hwmon powerN_rated_max) and high.emergency
# (tempN_emergency); docs/metrics.md lists them.
ENUMS = {
    "hw.state": {"degraded", "failed", "needs_cleaning", "ok", "predicted_failure"},
    "hw.type": {"gpu", "temperature", "voltage", "npu"},
    "hw.limit_type": {
        "critical",
        "degraded",
        "high.critical",
        "high.degraded",
        "low.critical",
        "low.degraded",
        "max",
        "throttled",
        "turbo",
        "rated_max",
        "high.emergency",
    },
    "hw.gpu.task": {"decoder", "encoder", "general"},
}


@pytest.fixture(scope="module")
def received(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every metric of one push of the fixture machines' telemetry, by name."""
    tmp = tmp_path_factory.mktemp("semconv")
    with OtlpReceiver() as rx:
        cfg = make_config(
            tmp,
            f"export:\n  otlp: {{enabled: true, endpoint: 'http://127.0.0.1:{rx.port}', "
            "interval_seconds: 3600, timeout_seconds: 5}\n",
        )
        exporters = start_telemetry(cfg)
        try:
            metrics: Series = exporters.metrics
            for machine in MACHINES:
                root = TESTDATA / machine
                Telemetry(discover(root), metrics, root).sample({})
            assert exporters.pusher.push()
        finally:
            exporters.shutdown()
        return {m.name: m for _, m in rx.metrics()}


def points(metric: Any) -> list[Any]:
    kind = metric.WhichOneof("data")
    return list(getattr(metric, kind).data_points)


@pytest.mark.parametrize("c", CONVENTIONS, ids=lambda c: c.name)
def test_each_hw_metric_is_as_the_conventions_define_it(c: Convention, received: dict) -> None:
    metric = received[c.name]
    assert metric.unit == c.unit, c.source
    kind = metric.WhichOneof("data")
    instrument = {
        "gauge": "gauge",
        "sum": "counter" if metric.sum.is_monotonic else "updowncounter",
    }
    assert instrument[kind] == c.instrument, c.source
    assert points(metric)
    for p in points(metric):
        assert p.WhichOneof("value") == ("as_int" if c.value_type == "int" else "as_double")
        have = attrs(p.attributes)
        assert {"hw.id", *c.required} <= have.keys(), (c.source, have)
        for key, allowed in ENUMS.items():
            assert have.get(key, next(iter(allowed))) in allowed, (key, have)


def test_every_hw_name_of_the_catalogue_is_a_row_here() -> None:
    """A spec named hw.* is a convention's metric: a new one gets its row."""
    assert {s.name for s in SPECS if s.name.startswith("hw.")} == {c.name for c in CONVENTIONS}


def test_sensors_are_components_of_their_device(received: dict) -> None:
    """A sensor names its device by hw.parent and carries none of the device's own
    descriptions: amdgpu's MI210 (hw.model, serial, firmware) among them."""
    parents = set()
    for name in ("hw.temperature", "hw.temperature.limit", "hw.voltage"):
        for p in points(received[name]):
            a = attrs(p.attributes)
            assert a["hw.type"] in ("temperature", "voltage")
            assert a["hw.id"].startswith(a["hw.parent"] + "/")
            assert "hw.sensor_location" in a and "sensor" not in a
            assert not {"hw.name", "hw.vendor", *HW_DESCRIPTIVE} & a.keys(), a
            parents.add(a["hw.parent"])
    assert "0000:c3:00.0" in parents  # the MI210, whose own points carry hw.model


def test_an_unknown_pci_vendor_is_left_off_not_its_id(received: dict) -> None:
    """amd-server's BMC graphics (ast, PCI vendor 1a03) has no vendor name the agent knows:
    its points carry no hw.vendor rather than the id."""
    ast = [
        attrs(p.attributes)
        for m in received.values()
        for p in points(m)
        if attrs(p.attributes).get("device") == "0000:02:00.0"
    ]
    assert ast and all("hw.vendor" not in a for a in ast)


def test_npu_points_leave_the_gpu_metrics(received: dict) -> None:
    """ivpu's memory is an NPU's: kubenpu.npu.memory.usage, not hw.gpu.memory.usage."""
    gpu = {attrs(p.attributes)["hw.type"] for p in points(received["hw.gpu.memory.usage"])}
    assert gpu == {"gpu"}
    [npu] = points(received["kubenpu.npu.memory.usage"])
    assert (attrs(npu.attributes)["hw.type"], npu.as_int) == ("npu", 64 << 20)


def test_amdgpu_points_carry_the_recommended_descriptive_attributes(received: dict) -> None:
    [point] = [
        p
        for p in points(received["hw.gpu.memory.limit"])
        if attrs(p.attributes)["device"] == "0000:c3:00.0"
    ]
    have = attrs(point.attributes)
    assert (have["hw.model"], have["hw.vendor"], have["hw.name"]) == (
        "AMD Instinct MI210",
        "AMD",
        "card1",
    )
    assert point.as_int == 25753026560
