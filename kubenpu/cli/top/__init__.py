"""kubenpuctl top: who is calling the GPU/NPU drivers right now, per pod, container and device.

Reads one agent's /metrics (two scrapes give the rates) or a Prometheus query API (rate() over a
window, across nodes). Standard library only: a small text-format parser, urllib, curses.

Columns follow the metric families the source has: call rates always; busy % per engine and
device memory only when the agent exports the fdinfo families (drivers that print usage stats).

In data-flow order: sources (read), frames (rows and sorting), render (columns, table, --once),
view (the live curses loop). This package's names are what kubenpuctl uses.
"""

from kubenpu.cli.top.frames import SORTS, build_frame
from kubenpu.cli.top.render import fmt_duration, once
from kubenpu.cli.top.sources import (
    BUSY,
    MEMORY,
    POD_LABELS,
    RATED,
    UNATTRIBUTED,
    PrometheusSource,
    Reading,
    ScrapeSource,
    Series,
    Source,
    TopError,
    counter_rates,
    parse,
)
from kubenpu.cli.top.view import live

__all__ = [
    "BUSY",
    "MEMORY",
    "POD_LABELS",
    "RATED",
    "SORTS",
    "UNATTRIBUTED",
    "PrometheusSource",
    "Reading",
    "ScrapeSource",
    "Series",
    "Source",
    "TopError",
    "build_frame",
    "counter_rates",
    "fmt_duration",
    "live",
    "once",
    "parse",
]
