"""scripts/payload_shape.py on the golden payloads of tests/test_payload_golden.py: what a shape
keeps (names, types, units, help, label and attribute keys) changes it, what it leaves out
(values) does not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import _script

payload_shape = _script("payload_shape")
TESTDATA = Path(__file__).parent / "testdata"
SCRAPE = (TESTDATA / "payload-prometheus.txt").read_text()
PUSH = (TESTDATA / "payload-otlp-semconv.json").read_text()
IOCTL_HELP = (
    "Driver ioctl calls (submit, alloc, wait) made by processes, per container and device. "
    "Counts calls, not utilisation."
)


def test_a_scrape_shows_each_familys_header_then_its_label_keys() -> None:
    lines = payload_shape.shape(SCRAPE)
    at = lines.index(f"kubenpu_ioctl counter unit= help={IOCTL_HELP}")
    assert lines[at + 1 : at + 4] == [
        "  kubenpu_ioctl_total {container,device,kind,namespace,pod,pod_uid,vendor}",
        "  kubenpu_ioctl_total {otel_metric_overflow}",
        "kubenpu_ioctl_duration_seconds histogram unit= help=How long counted driver calls took, "
        "from the hook's entry to the call's return, per container and device; the kernel's "
        "buckets (docs/latency.md). CO-RE loader, aggregate mode.",
    ]


def test_a_scrape_has_one_shape_in_either_format() -> None:
    openmetrics = (TESTDATA / "payload-openmetrics.txt").read_text()
    assert payload_shape.shape(openmetrics) == payload_shape.shape(SCRAPE)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('pod_uid="', 'pod_id="'),  # a renamed label
        ("kubenpu_ioctl_total", "kubenpu_ioctls_total"),  # a renamed metric
        ("Counts calls, not utilisation.", "Counts calls."),  # a new help
        ("# TYPE kubenpu_memory_bytes gauge", "# TYPE kubenpu_memory_bytes untyped"),
    ],
)
def test_a_scrapes_shape_changes_with_its_names_and_types(old: str, new: str) -> None:
    assert old in SCRAPE
    assert payload_shape.shape(SCRAPE.replace(old, new)) != payload_shape.shape(SCRAPE)


def test_a_scrapes_shape_leaves_its_values_out() -> None:
    other_values = re.sub(r"^([^#].*) \S+$", r"\1 7.0", SCRAPE, flags=re.MULTILINE)
    assert other_values != SCRAPE
    assert payload_shape.shape(other_values) == payload_shape.shape(SCRAPE)


def test_a_push_shows_its_resource_scope_and_each_metrics_attribute_keys() -> None:
    lines = payload_shape.shape(PUSH)
    keys = "host.name,k8s.node.name,service.instance.id,service.name,service.version,"
    keys += "telemetry.sdk.language,telemetry.sdk.name,telemetry.sdk.version"
    assert f"resource {{{keys}}}" in lines
    assert "scope kubenpu" in lines
    head = "metric kubenpu.ioctl sum monotonic cumulative values=int unit={call} description="
    at = lines.index(head + IOCTL_HELP)
    # A pod's calls; a ctr container's (no pod); a host process's (no k8s.* at all): a pod
    # attribute with no value is left off.
    assert lines[at + 1 : at + 5] == [
        "  {device,k8s.container.name,k8s.namespace.name,k8s.pod.name,k8s.pod.uid,kind,vendor}",
        "  {device,k8s.container.name,k8s.namespace.name,kind,vendor}",
        "  {device,kind,vendor}",
        "  {otel.metric.overflow}",
    ]
    assert "metric kubenpu.npu.memory.usage sum non-monotonic cumulative values=int unit=By " in [
        line[: line.index("description=")] for line in lines if line.startswith("metric ")
    ]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"key": "k8s.pod.uid"', '"key": "k8s.pod.id"'),  # a renamed attribute
        ('"key": "service.instance.id"', '"key": "service.instance"'),  # ... of the resource
        ('"unit": "{call}"', '"unit": "{calls}"'),
        ('"isMonotonic": true', '"isMonotonic": false'),
        ('"asInt": "120"', '"asDouble": 120.0'),  # an int value pushed as a double
    ],
)
def test_a_pushs_shape_changes_with_its_names_units_and_types(old: str, new: str) -> None:
    assert old in PUSH
    assert payload_shape.shape(PUSH.replace(old, new)) != payload_shape.shape(PUSH)


def test_a_pushs_shape_leaves_its_values_out() -> None:
    assert '"asInt": "120"' in PUSH
    assert payload_shape.shape(PUSH.replace('"asInt": "120"', '"asInt": "121"')) == (
        payload_shape.shape(PUSH)
    )


def test_the_collectors_file_exporter_lines_have_the_pushs_shape() -> None:
    """One request a line, enums as integers: how the Collector's file exporter writes them."""
    lines = "\n".join(json.dumps(r) for r in json.loads(PUSH)) + "\n"
    lines = lines.replace('"AGGREGATION_TEMPORALITY_CUMULATIVE"', "2")
    assert payload_shape.shape(lines) == payload_shape.shape(PUSH)


def test_the_script_prints_each_files_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert payload_shape.main([str(TESTDATA / "payload-otlp-semconv.json")]) == 0
    assert capsys.readouterr().out == "\n".join(payload_shape.shape(PUSH)) + "\n"
    assert payload_shape.main([]) == 2
