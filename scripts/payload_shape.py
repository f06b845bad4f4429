"""The shape of an agent's payload, its values left out: for a change that must keep every name,
label, unit, description and type (a refactor), `diff` the shapes of a real run before and after.

A /metrics scrape (Prometheus text or OpenMetrics): each family's name, type, unit and help, and
under it each sample name with every set of label keys it comes with. An OTLP/JSON push (one
ExportMetricsServiceRequest, a list of them, or one a line as the Collector's file exporter writes
them): the resource's attribute keys, the scope, each metric's name, type (monotonic,
temporality), value types (int, double), unit and description, and every set of attribute keys
of its points. Pushes and batches are merged; lines are sorted, so order does not show.

usage: scripts/payload_shape.py FILE...
e.g.   scripts/payload_shape.py OUT/aggregate/metrics.txt > before.shape  (tests/vm/e2e_guest.py
       saves the scrape there), then the same after the change, and diff before.shape after.shape
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

OTLP_DATA = ("sum", "gauge", "histogram", "exponentialHistogram", "summary")
# OTLP/JSON writes enums as integers (the Collector) or, from protobuf's JSON mapping, by name.
TEMPORALITY = {1: "delta", 2: "cumulative"}
VALUE_TYPES = {"asInt": "int", "asDouble": "double"}  # a number point's value field

_Shape = dict[str, set[str]]  # a family's or metric's line -> the lines under it


def _keys(names: Iterable[str]) -> str:
    return "{" + ",".join(sorted(names)) + "}"


def _lines(shape: _Shape) -> list[str]:
    return [line for head in sorted(shape) for line in (head, *sorted(shape[head]))]


def prometheus_shape(text: str) -> list[str]:
    parse = openmetrics_families if text.rstrip().endswith("# EOF") else text_families
    shape: _Shape = {}
    for family in parse(text):
        head = f"{family.name} {family.type} unit={family.unit} help={family.documentation}"
        shape.setdefault(head, set()).update(
            f"  {s.name} {_keys(s.labels)}" for s in family.samples
        )
    return _lines(shape)


def _requests(text: str) -> list[dict[str, Any]]:
    try:
        found = json.loads(text)
    except json.JSONDecodeError:  # one request a line
        found = [json.loads(line) for line in text.splitlines() if line.strip()]
    return found if isinstance(found, list) else [found]


def _temporality(value: int | str) -> str:
    if isinstance(value, int):
        return TEMPORALITY.get(value, str(value))
    return value.removeprefix("AGGREGATION_TEMPORALITY_").lower()


def _metric_head(metric: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A metric's line, and its points."""
    kind = next(k for k in OTLP_DATA if k in metric)
    data = metric[kind]
    points = data.get("dataPoints", [])
    parts = [metric["name"], kind]
    if kind == "sum":
        parts.append("monotonic" if data.get("isMonotonic") else "non-monotonic")
    if "aggregationTemporality" in data:
        parts.append(_temporality(data["aggregationTemporality"]))
    values = sorted({t for p in points for k, t in VALUE_TYPES.items() if k in p})
    parts += [f"values={','.join(values)}", f"unit={metric.get('unit', '')}"]
    return " ".join([*parts, f"description={metric.get('description', '')}"]), points


def otlp_shape(text: str) -> list[str]:
    shape: _Shape = {}
    for request in _requests(text):
        for rm in request.get("resourceMetrics", []):
            attrs = rm.get("resource", {}).get("attributes", [])
            shape.setdefault(f"resource {_keys(kv['key'] for kv in attrs)}", set())
            for sm in rm.get("scopeMetrics", []):
                shape.setdefault(f"scope {sm.get('scope', {}).get('name', '')}", set())
                for metric in sm.get("metrics", []):
                    head, points = _metric_head(metric)
                    shape.setdefault(f"metric {head}", set()).update(
                        f"  {_keys(kv['key'] for kv in p.get('attributes', []))}" for p in points
                    )
    return _lines(shape)


def shape(text: str) -> list[str]:
    """The shape of a scrape or an OTLP/JSON push, told apart by their first character."""
    otlp = text.lstrip().startswith(("{", "["))
    return otlp_shape(text) if otlp else prometheus_shape(text)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for path in argv:
        print("\n".join(shape(Path(path).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
