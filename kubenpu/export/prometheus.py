"""Prometheus rendering: the agent's Metrics as a prometheus_client collector, plus target_info
for the resource. Names are Spec.prometheus_name: Prometheus' own OTLP translation of each OTel
name and unit, so both export paths name a metric alike."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
from prometheus_client.core import Metric as PromMetric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from kubenpu.kernel import abi
from kubenpu.metrics.catalogue import CRI_BOUNDS, Spec
from kubenpu.metrics.store import ExpHist, Hist, Metrics, Point

# The classic buckets of an ExpHist: every other power of two of its range, 2^-20 s to 2^6 s,
# each an edge of the kernel's buckets, so no count is re-binned. `le` 2^k holds the under
# slot and every bucket whose upper bound 2^((i+1)/4) is at most 2^k: the slots before
# 4k + 1 - FIRST_INDEX.
EXP_EDGES = tuple((2.0**k, 4 * k + 1 - abi.FIRST_INDEX) for k in range(abi.FIRST_INDEX // 4, 7, 2))


def _label_name(key: str) -> str:
    return key.replace(".", "_")


def _label_value(v: str | bool) -> str:
    return str(v).lower() if isinstance(v, bool) else v


class PrometheusCollector(Collector):
    """Renders Metrics snapshots for prometheus_client, plus target_info for the resource."""

    def __init__(self, metrics: Metrics, resource: Resource) -> None:
        self._metrics = metrics
        self._target = {_label_name(k): str(v) for k, v in resource.attributes.items()}

    def collect(self) -> Iterator[PromMetric]:
        info = PromMetric("target_info", "Target metadata (the OTel resource)", "gauge")
        info.add_sample("target_info", self._target, 1)
        yield info
        for spec, points in self._metrics.collect():
            yield self._family(spec, points)

    @staticmethod
    def _family(spec: Spec, points: list[Point]) -> PromMetric:
        name = spec.prometheus_name
        fam = PromMetric(name.removesuffix("_total"), spec.description, spec.prometheus_kind)
        for p in points:
            labels = {_label_name(k): _label_value(v) for k, v in p.attrs.items()}
            if isinstance(p.value, Hist | ExpHist):
                for le, n in _cumulative(p.value):
                    fam.add_sample(name + "_bucket", {**labels, "le": le}, n)
                fam.add_sample(name + "_count", labels, p.value.count)
                fam.add_sample(name + "_sum", labels, p.value.total)
            else:
                fam.add_sample(name, labels, p.value)
        return fam


def _cumulative(h: Hist | ExpHist) -> Iterator[tuple[str, int]]:
    """(le, calls at most le) of a histogram's classic buckets, +Inf last."""
    if isinstance(h, ExpHist):
        for edge, end in EXP_EDGES:
            yield repr(edge), sum(h.slots[:end])
    else:
        cumulative = 0
        for bound, n in zip(CRI_BOUNDS, h.buckets, strict=False):
            cumulative += n
            yield repr(bound), cumulative
    yield "+Inf", h.count


class MetricsApp:
    """/metrics for the metrics server: prometheus_client's WSGI app for the agent's Metrics,
    with the process' own metrics, and which of its renderings a request gets."""

    def __init__(self, metrics: Metrics, resource: Resource) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(PrometheusCollector(metrics, resource))
        ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends
        self._app = make_wsgi_app(registry)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        return self._app(environ, start_response)

    @staticmethod
    def variant(accept: str, encoding: str) -> Hashable:
        """The rendering that requests with these Accept and Accept-Encoding headers get: the
        same bytes for all the requests of one variant (the server shares them)."""
        return choose_encoder(accept)[1], gzip_accepted(encoding)
