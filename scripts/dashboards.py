"""Every Grafana dashboard query, run on a real Prometheus holding a real agent's recorded data.

The VM e2e guest (tests/vm/e2e_guest.py) records timestamped scrapes of the agent's /metrics while
pods make calls. This backfills them into a Prometheus TSDB with `promtool tsdb
create-blocks-from openmetrics`, adding the `node` label the ServiceMonitor's relabeling adds in a
cluster, starts Prometheus on it and runs each template variable's and panel's query over the
recorded time range the way Grafana would. tests/test_e2e_vm.py asserts on the results; `draw`
renders each dashboard's panels from them (matplotlib; Grafana itself cannot run here).

usage: scripts/dashboards.py RECORDING.json [OUT_DIR]  (draws OUT_DIR/dashboard-NAME.png, default
docs/, and prints what each query returned as a Markdown table)
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

ROOT = Path(__file__).resolve().parents[1]
GRAFANA = ROOT / "deploy" / "grafana"
TARGET = {"job": "kubenpu", "instance": "127.0.0.1:8080"}  # what a scrape adds besides `node`
LABEL_VALUES = re.compile(r"label_values\((.+), *(\w+)\)")  # (series selector, label)
REGEX_SPECIAL = re.compile(r"[\\^$*+?.()|\[\]{}]")
LEGEND = re.compile(r"{{ *(\w+) *}}")
Series = dict[str, Any]  # Prometheus API: {"metric": {labels}, "values": [[t, "v"], ...]}


# --- the recording into a TSDB -------------------------------------------------------------------


def openmetrics(record: dict) -> str:
    """The recorded scrapes as one OpenMetrics text with timestamps: each family once, each series'
    points in time order, with the labels a scrape by the ServiceMonitor adds (an exposed `node`
    becomes `exported_node`, as Prometheus does without honor_labels)."""
    families: dict[str, Any] = {}
    for scrape in record["scrapes"]:
        for family in text_string_to_metric_families(scrape["text"]):
            stamped = [s._replace(timestamp=scrape["time"]) for s in family.samples]
            merged = families.setdefault(family.name, family)
            merged.samples = stamped if merged is family else merged.samples + stamped
    for family in families.values():
        family.samples = sorted(
            (relabel(s, record["node"]) for s in family.samples),
            key=lambda s: (s.name, sorted(s.labels.items()), s.timestamp),
        )

    class Recorded:
        def collect(self) -> Iterator[Any]:
            return iter(families.values())

    return generate_latest(Recorded()).decode()  # type: ignore[arg-type]


def relabel(sample: Sample, node: str) -> Sample:
    labels = dict(sample.labels)
    if "node" in labels:
        labels["exported_node"] = labels.pop("node")
    return sample._replace(labels={**labels, **TARGET, "node": node})


def backfill(promtool: Path, record: dict, tsdb: Path) -> None:
    source = tsdb.parent / "recording.om"
    source.write_text(openmetrics(record))
    tsdb.mkdir(parents=True, exist_ok=True)
    cmd = [str(promtool), "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


# --- Prometheus --------------------------------------------------------------------------------


@dataclass
class Api:
    url: str

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as reply:
                body = json.load(reply)
        except urllib.error.HTTPError as e:  # Prometheus explains a bad query in the body
            body = json.load(e)
        if body["status"] != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def prometheus(binary: Path, tsdb: Path) -> Iterator[Api]:
    """Prometheus serving the TSDB at `tsdb` (no scrapes), until the block ends."""
    port = free_port()
    config = tsdb.parent / "prometheus.yml"
    config.write_text("scrape_configs: []\n")
    cmd = [
        str(binary),
        f"--config.file={config}",
        f"--storage.tsdb.path={tsdb}",
        "--storage.tsdb.retention.time=100y",  # a recording committed long ago stays loaded
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    log = tsdb.parent / "prometheus.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, log)
        yield Api(f"http://127.0.0.1:{port}")
    finally:
        proc.terminate()
        proc.wait(30)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"prometheus did not become ready: {log.read_text()[-2000:]}"
                ) from None
            time.sleep(0.2)


# --- the dashboards' queries, run as Grafana runs them --------------------------------------------


@dataclass
class Query:
    """One panel target: its PromQL as written and with Grafana's variables replaced."""

    panel: str
    kind: str  # the panel type: timeseries (a range query) or table (an instant query)
    ref: str
    expr: str
    legend: str
    column: str | None = None  # a table's column for the values (None: hidden)
    hidden: frozenset[str] = frozenset()  # a table's label columns not shown
    unit: str | None = None  # Grafana's unit for the values
    wide: bool = False  # the panel spans the board's width
    promql: str = ""
    result: list[Series] = field(default_factory=list)

    @property
    def legend_labels(self) -> list[str]:
        return LEGEND.findall(self.legend)


@dataclass
class Board:
    name: str
    title: str
    variables: dict[str, list[str]]  # each query variable's values, as Grafana lists them
    queries: list[Query]


@dataclass(frozen=True)
class Window:
    """The recorded range and the step and intervals Grafana would use on it."""

    start: float
    end: float
    scrape_interval: float
    step: float = 1.0

    @classmethod
    def of(cls, record: dict) -> Window:
        times = [s["time"] for s in record["scrapes"]]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return cls(times[0], times[-1], float(round(max(gaps) + 0.5)))

    @property
    def first_step(self) -> float:
        """Steps counted back from the end, so the last step sees the last scrape."""
        return self.end - (self.end - self.start) // self.step * self.step

    @property
    def rate_interval(self) -> str:
        """Grafana's $__rate_interval: max(4 scrape intervals, step + 1 scrape interval)."""
        seconds = max(4 * self.scrape_interval, self.step + self.scrape_interval)
        return f"{seconds:.0f}s"

    @property
    def range(self) -> str:
        return f"{self.end - self.start:.0f}s"


def boards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}


def variable_values(api: Api, query: str, at: Window) -> list[str]:
    """A `label_values(series selector, label)` variable, resolved through the label values API
    as Grafana's Prometheus data source does."""
    match = LABEL_VALUES.fullmatch(query)
    if not match:
        raise ValueError(f"unsupported variable query: {query}")
    metric, label = match.groups()
    return api.get(f"label/{label}/values", **{"match[]": metric, "start": at.start, "end": at.end})


def substitute(expr: str, variables: dict[str, list[str]], at: Window) -> str:
    """Grafana's variables: a multi-value selection of every value becomes (a|b)."""
    values = {f"${k}": "(" + "|".join(map(regex_escape, v)) + ")" for k, v in variables.items()}
    values |= {"$__rate_interval": at.rate_interval, "$__range": at.range}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(name, values[name])
    if "$" in expr:
        raise ValueError(f"unreplaced variable in {expr}")
    return expr


def regex_escape(value: str) -> str:
    """Grafana's escaping of a value for a PromQL regex (a backslash doubled in the string)."""
    return REGEX_SPECIAL.sub(lambda m: "\\\\" + m.group(0), value)


def organize(panel: dict) -> dict:
    return next(
        (t["options"] for t in panel.get("transformations", []) if t["id"] == "organize"), {}
    )


def value_columns(panel: dict) -> dict[str, str]:
    """refId -> the column a table shows the query's values under: Grafana names it `Value`, or
    `Value #refId` when the table merges several queries, unless renamed; hidden ones left out."""
    options = organize(panel)
    renames, hidden = options.get("renameByName", {}), options.get("excludeByName", {})
    several = len(panel["targets"]) > 1
    raw = {t["refId"]: f"Value #{t['refId']}" if several else "Value" for t in panel["targets"]}
    return {ref: renames.get(name, name) for ref, name in raw.items() if not hidden.get(name)}


def units(panel: dict) -> dict[str, str | None]:
    """refId -> the unit Grafana shows the query's values in: an override matching its frame (a
    time series) or its column (a table), else the panel's default; hidden columns left out."""
    config = panel["fieldConfig"]
    by = {
        (o["matcher"]["id"], o["matcher"]["options"]): p["value"]
        for o in config["overrides"]
        for p in o["properties"]
        if p["id"] == "unit"
    }
    default = config["defaults"].get("unit")
    if panel["type"] == "table":
        return {ref: by.get(("byName", c), default) for ref, c in value_columns(panel).items()}
    return {t["refId"]: by.get(("byFrameRefID", t["refId"]), default) for t in panel["targets"]}


def run(api: Api, name: str, board: dict, at: Window) -> Board:
    variables = {
        v["name"]: variable_values(api, v["query"]["query"], at)
        for v in board["templating"]["list"]
        if v["type"] == "query"
    }
    queries = []
    for panel in board["panels"]:
        if panel["type"] == "row":  # a heading: no queries
            continue
        columns = value_columns(panel) if panel["type"] == "table" else {}
        hidden = frozenset(k for k, v in organize(panel).get("excludeByName", {}).items() if v)
        unit, wide = units(panel), panel["gridPos"]["w"] > 12
        for target in panel["targets"]:
            ref = target["refId"]
            q = Query(
                panel["title"], panel["type"], ref, target["expr"], target.get("legendFormat", ""),
                columns.get(ref), hidden, unit.get(ref), wide,
            )  # fmt: skip
            q.promql = substitute(q.expr, variables, at)
            if q.kind == "table":
                q.result = api.get("query", query=q.promql, time=at.end)["result"]
            else:
                q.result = api.get(
                    "query_range", query=q.promql, start=at.first_step, end=at.end, step=at.step
                )["result"]
            queries.append(q)
    return Board(name, board["title"], variables, queries)


def run_all(tools: Path, record: dict, work: Path) -> list[Board]:
    """Every dashboard's variables and panel queries on the recording."""
    backfill(tools / "promtool", record, work / "tsdb")
    at = Window.of(record)
    with prometheus(tools / "prometheus", work / "tsdb") as api:
        return [run(api, name, board, at) for name, board in boards().items()]


# --- pictures ----------------------------------------------------------------------------------


def legend(q: Query, labels: dict[str, str]) -> str:
    return LEGEND.sub(lambda m: labels.get(m.group(1), ""), q.legend) or q.ref


def draw(board: Board, at: Window, png: Path) -> None:
    """The board's panels in a grid, as a picture: time series as lines, tables as tables."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = {q.panel: [p for p in board.queries if p.panel == q.panel] for q in board.queries}
    rows = layout([(title, queries[0].wide) for title, queries in panels.items()])
    fig = plt.figure(figsize=(15, 4.2 * len(rows)), layout="constrained")
    grid = fig.add_gridspec(len(rows), 2)
    for r, row in enumerate(rows):
        for c, title in enumerate(row):
            ax = fig.add_subplot(
                grid[r, :] if len(row) == 1 and panels[title][0].wide else grid[r, c]
            )
            queries = panels[title]
            (draw_table if queries[0].kind == "table" else draw_lines)(ax, queries, at)
            ax.set_title(title, fontsize=11, loc="left")
    variables = ", ".join(f"{k} = {'|'.join(v)}" for k, v in board.variables.items())
    fig.suptitle(f"{board.title}  ({variables}; data: a real agent in the VM e2e)", fontsize=13)
    fig.savefig(png, dpi=80)
    plt.close(fig)


def layout(panels: list[tuple[str, bool]]) -> list[list[str]]:
    """Rows of the picture, as on the board: a wide panel alone, narrow ones two by two."""
    rows: list[list[str]] = []
    room = False  # the last row has room for one more narrow panel
    for title, wide in panels:
        if wide or not room:
            rows.append([title])
            room = not wide
        else:
            rows[-1].append(title)
            room = False
    return rows


def draw_lines(ax: Any, queries: list[Query], at: Window) -> None:
    for q in queries:
        for series in q.result:
            t = [float(p[0]) - at.start for p in series["values"]]
            ax.plot(t, [float(p[1]) for p in series["values"]], label=legend(q, series["metric"]))
    ax.set_xlim(0, at.end - at.start)
    ax.set_xlabel("seconds into the recording")
    ax.set_ylabel(" / ".join(dict.fromkeys(q.unit or "" for q in queries)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=2)


def draw_table(ax: Any, queries: list[Query], at: Window) -> None:
    """Grafana's merge: one row per label set, a column of each query's values."""
    rows: dict[tuple, dict[str, str]] = {}
    hidden = set(TARGET) | queries[0].hidden
    for q in queries:
        for s in q.result:
            labels = tuple(sorted((k, v) for k, v in s["metric"].items() if k not in hidden))
            row = rows.setdefault(labels, dict(labels))
            if q.column:
                row[q.column] = fmt(s["value"][1])
    labels = sorted({k for key in rows for k, _ in key})
    columns = labels + [q.column for q in queries if q.column]
    ax.axis("off")
    if rows:
        cells = [[row.get(c, "") for c in columns] for row in rows.values()]
        table = ax.table(cellText=cells, colLabels=columns, loc="upper center")
        table.auto_set_font_size(False)
        table.set_fontsize(7)
        table.scale(1, 1.2)


def fmt(value: str) -> str:
    return f"{float(value):.3g}"


def tools() -> Path:
    """The directory with prometheus and promtool (scripts/tools.sh fetches them once)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "tools.sh")], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    record = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1]) if len(argv) > 1 else ROOT / "docs"
    with tempfile.TemporaryDirectory() as work:
        results = run_all(tools(), record, Path(work))
    for board in results:
        draw(board, Window.of(record), out / f"dashboard-{board.name}.png")
    print(table(results))
    return 0


def table(results: list[Board]) -> str:
    """What each query returned, as docs/dashboards.md's table (tests/test_dashboards.py checks
    that the page holds this table, so a panel added later cannot be missing from it)."""
    lines = ["| dashboard | panel | query | series | points |", "|---|---|---|---|---|"]
    for board in results:
        for q in board.queries:
            points = sum(len(s.get("values", [s.get("value")])) for s in q.result)
            lines.append(f"| {board.name} | {q.panel} | {q.ref} | {len(q.result)} | {points} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
