"""The two ways the agent's series reach Prometheus, as label sets: the scrape of /metrics
(through the chart's ServiceMonitor) and an OTLP push through the shipped Collector
(deploy/otel/collector.yaml) and its prometheusremotewrite exporter.

No Collector binary can be had here (Debian packages none), so the Collector's part is done
in Python from the shipped config itself: its `resource` processor's upserts, its transform's
OTTL statements (each form this file knows; any other fails, so a new statement cannot pass
unread), and the exporter's naming, prometheus/otlptranslator's normalizeName with
add_metric_suffixes as the config sets it (unit suffix, `_total` for monotonic sums, `_ratio`
for unit-1 gauges only; an exponential histogram is a native histogram: no `_bucket`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Labels = dict[str, str]
Series = list[tuple[str, Labels]]

# otlptranslator's unit map, for the units the agent uses ({...} annotations name nothing).
_UNITS = {"s": "seconds", "By": "bytes", "W": "watts", "J": "joules", "Cel": "celsius"}
_UNITS |= {"Hz": "hertz", "V": "volts", "1": "", "%": "percent"}
_RENAME = re.compile(r'set\(name, "([^"]+)"\) where name == "([^"]+)"')
_COPY = re.compile(
    r'set\(attributes\["([^"]+)"\], attributes\["([^"]+)"\]\) where attributes\["\2"\] != nil'
)
_DELETE = re.compile(r'delete_matching_keys\(attributes, "(.*)"\)')


def scrape_series(text: str, target: Labels) -> Series:
    """A Prometheus text page's series, each with the target's labels where it has none of its
    own (honorLabels), and the scrape's own `up`."""
    out: Series = [("up", dict(target))]
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([\w:]+)(?:\{(.*)\})? \S+", line)
        assert match, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match[2] or ""))
        out.append((match[1], target | labels))
    return out


def _value(value: dict[str, Any]) -> str:
    (kind, v), *_ = value.items()
    return str(v).lower() if kind == "boolValue" else str(v)


def _attributes(items: list[dict[str, Any]]) -> Labels:
    return {a["key"]: _value(a["value"]) for a in items}


def _label(key: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


class Collector:
    """deploy/otel/collector.yaml's metrics pipeline, as far as names and labels go."""

    def __init__(self, config_path: Path) -> None:
        config = yaml.safe_load(config_path.read_text())
        pipeline = config["service"]["pipelines"]["metrics"]
        assert "prometheusremotewrite" in pipeline["exporters"]
        exporter = config["exporters"]["prometheusremotewrite"] or {}
        self.suffixes = exporter.get("add_metric_suffixes", True)
        self.resource_labels = exporter["resource_to_telemetry_conversion"]["enabled"]
        self.upserts: list[tuple[str, str]] = []
        self.renames: dict[str, str] = {}
        self.copies: list[tuple[str, str]] = []
        self.deletes: list[re.Pattern[str]] = []
        for name in pipeline["processors"]:
            self._read_processor(name, config["processors"][name])

    def _read_processor(self, name: str, body: dict[str, Any]) -> None:
        kind = name.split("/")[0]
        if kind in ("memory_limiter", "batch"):
            return  # no name or label changes
        if kind == "resource":
            for action in body["attributes"]:
                assert action["action"] == "upsert", action
                self.upserts.append((action["key"], action["from_attribute"]))
            return
        assert kind == "transform", f"a processor this emulation does not know: {name}"
        for group in body["metric_statements"]:
            for statement in group["statements"]:
                self._read_statement(group["context"], statement)

    def _read_statement(self, context: str, statement: str) -> None:
        if context == "metric" and (m := _RENAME.fullmatch(statement)):
            self.renames[m[2]] = m[1]
        elif context == "datapoint" and (m := _COPY.fullmatch(statement)):
            self.copies.append((m[1], m[2]))
        elif context == "datapoint" and (m := _DELETE.fullmatch(statement)):
            self.deletes.append(re.compile(m[1].replace("\\\\", "\\")))
        else:
            raise AssertionError(f"an OTTL statement this emulation does not know: {statement}")

    def series(self, requests: list[dict[str, Any]]) -> Series:
        """What remote write stores for the pushed requests (OTLP/JSON)."""
        out: Series = []
        for request in requests:
            for rm in request["resourceMetrics"]:
                resource = _attributes(rm["resource"]["attributes"])
                for key, source in self.upserts:
                    if source in resource:
                        resource[key] = resource[source]
                target = {"job": resource["service.name"]}
                target["instance"] = resource.get("service.instance.id", "")
                if self.resource_labels:
                    target |= {_label(k): v for k, v in resource.items()}
                for sm in rm["scopeMetrics"]:
                    for metric in sm["metrics"]:
                        out += self._metric(metric, target)
        return out

    def _metric(self, metric: dict[str, Any], target: Labels) -> Iterator[tuple[str, Labels]]:
        kind = next(k for k in ("sum", "gauge", "histogram", "exponentialHistogram") if k in metric)
        name = self.name(self.renames.get(metric["name"], metric["name"]), metric, kind)
        for point in metric[kind]["dataPoints"]:
            labels = self._point_labels(_attributes(point.get("attributes", [])))
            labels = target | labels
            if kind == "histogram":
                bounds = [*map(str, point.get("explicitBounds", [])), "+Inf"]
                yield from ((name + "_bucket", labels | {"le": le}) for le in bounds)
                yield from ((name + s, labels) for s in ("_sum", "_count"))
            else:  # an exponential histogram is one native-histogram series
                yield name, labels

    def _point_labels(self, attributes: Labels) -> Labels:
        for ours, theirs in self.copies:
            if theirs in attributes:
                attributes[ours] = attributes[theirs]
        kept = {k: v for k, v in attributes.items() if not any(d.search(k) for d in self.deletes)}
        return {_label(k): v for k, v in kept.items()}

    def name(self, otel: str, metric: dict[str, Any], kind: str) -> str:
        tokens = [t for t in re.split(r"[^a-zA-Z0-9:]", otel) if t]
        if not self.suffixes:
            return "_".join(tokens)
        unit = metric.get("unit", "")
        suffix = "" if unit.startswith("{") else _UNITS.get(unit, unit)
        if suffix and suffix not in tokens:
            tokens.append(suffix)
        if kind == "sum" and metric["sum"].get("isMonotonic"):
            tokens = [t for t in tokens if t != "total"] + ["total"]
        if unit == "1" and kind == "gauge":
            tokens = [t for t in tokens if t != "ratio"] + ["ratio"]
        return "_".join(tokens)


# A vector selector of the agent's series (or the scrape's `up`), not a recording rule's name.
_SELECTOR = re.compile(r"(?<![\w:])(kubenpu_\w+|up)(?![\w:(])\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_GROUPING = re.compile(r"\b(?:by|on|ignoring|without)\s*\(([^)]*)\)")


def _matches(labels: Labels, matchers: list[tuple[str, str, str]]) -> bool:
    for key, op, value in matchers:
        have = labels.get(key, "")
        hit = re.fullmatch(value, have) is not None if "~" in op else have == value
        if hit != (op in ("=", "=~")):
            return False
    return True


def _or_arms(expr: str) -> list[list[tuple[int, int]]]:
    """The spans of the arms of each `or` in expr, by the parenthesised group holding it."""
    groups: dict[int, list[int]] = {}  # a group's start -> the positions of its depth-0 ors
    stack, ends = [-1], {}
    for i, ch in enumerate(expr):
        if ch == "(":
            stack.append(i)
        elif ch == ")":
            ends[stack.pop()] = i
        elif re.match(r"\bor\b", expr[i : i + 3]) and (i == 0 or not re.match(r"\w", expr[i - 1])):
            groups.setdefault(stack[-1], []).append(i)
    ends[-1] = len(expr)
    arms = []
    for start, ors in groups.items():
        cuts = [start + 1, *(o + 2 for o in ors)]
        stops = [*ors, ends[start]]
        arms.append(list(zip(cuts, stops, strict=True)))
    return arms


def unmatched(expr: str, series: Series) -> list[str]:
    """What of a query finds nothing in the series: each selector that selects no series (but
    for one in an arm of an `or` whose other arm finds all its own: a query written for both
    paths), and each label it groups or joins on that none of the selected series carries."""
    missing: list[tuple[int, str]] = []
    found: list[int] = []
    keys: set[str] = set()
    for m in _SELECTOR.finditer(expr):
        name, body = m[1], m[2] or ""
        matchers = _MATCHER.findall(body)
        hits = [labels for n, labels in series if n == name and _matches(labels, matchers)]
        (found if hits else missing).append(m.start() if hits else (m.start(), name + body))
        keys.update(*(labels.keys() for labels in hits))

    def whole(a: int, b: int) -> bool:  # an arm with selectors, each of which found series
        inside = [f for f in found if a <= f < b]
        return bool(inside) and not any(a <= at < b for at, _ in missing)

    excused = {
        at
        for arms in _or_arms(expr)
        for at, _ in missing
        for a, b in arms
        if a <= at < b and any(whole(c, d) for c, d in arms if (c, d) != (a, b))
    }
    gaps = [text for at, text in missing if at not in excused]
    if not keys:
        return gaps
    grouped = {k.strip() for g in _GROUPING.findall(expr) for k in g.split(",") if k.strip()}
    return gaps + sorted(f"label {k}" for k in grouped - keys - {"le"})
