"""kubenpuctl top, used as a person and a script would: against /metrics snapshots recorded with
the agent's own exporter (tests/testdata/top/record.py) and served by a real HTTP server, in a
real tmux terminal, and through a real Prometheus.

The recorded pods call at known rates (record.RATES), so every rate on screen is known. Timing
is never asserted: rates are compared with a tolerance over the interval the server measured,
and their ratios to each other, which no timing affects, exactly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fakes import Clock, FakeResolver
from helpers import free_port, make_config, receiver_tools, run_server, script_output
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kubenpu.cli import top
from kubenpu.cli.ctl import main as ctl_main
from kubenpu.cli.top import sources
from kubenpu.cli.top.render import columns
from kubenpu.cli.top.sources import (
    ALLOCATED,
    BEHIND,
    IDLE_WAIT,
    SOURCES,
    STAMP,
    ScrapeSource,
    TopError,
)
from kubenpu.cli.top.view import ALIASES, HELP, _View
from kubenpu.discovery import Device, Node
from kubenpu.export import build_resource
from kubenpu.export.prometheus import PrometheusCollector
from kubenpu.sources.calls.attribution import Attributor
from kubenpu.sources.calls.events import Key, Tally
from kubenpu.sources.registry import table

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests/testdata/top"
KUBENPUCTL = Path(sys.executable).parent / "kubenpuctl"
_spec = importlib.util.spec_from_file_location("record", DATA / "record.py")
assert _spec and _spec.loader
record = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record)
KINDS = ("submit", "alloc", "wait")
VGEM = Device("platform:vgem", None, None, None, (Node("/dev/dri/card0", "card0", 226, 0),), "vgem")


def fixture(name: str) -> str:
    return (DATA / name).read_text()


# --- a /metrics server with recorded snapshots ---------------------------------------------


class MetricsServer:
    """Serves /metrics on 127.0.0.1 from `body(now)`; keeps the time of every scrape."""

    def __init__(self, body: Callable[[float], str]) -> None:
        self.served: list[float] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                now = time.monotonic()
                data = body(now).encode()
                server.served.append(now)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def sequence(*texts: str) -> Callable[[float], str]:
    """The snapshots in order, then the last one again."""
    served = []

    def body(now: float) -> str:
        served.append(now)
        return texts[min(len(served), len(texts)) - 1]

    return body


def linear(before: str, after: str, seconds: float) -> Callable[[float], str]:
    """`after`, its counters growing on at the rate they grew from `before`: any two scrapes,
    whenever they come, see the recorded rates. Every source is stamped as read at the instant
    the values are of, as the agent stamps its reads: top rates over the stamps, so a scrape
    answered or read late on a loaded machine changes no rate."""
    old = dict(_values(before))
    start = time.monotonic()

    def body(now: float) -> str:
        lines = []
        for line in after.splitlines():
            key, _, value = line.rpartition(" ")
            if not line.startswith("#") and "_total" in key and float(value) > old.get(key, 0):
                growth = (float(value) - old[key]) / seconds if key in old else 0.0
                line = f"{key} {float(value) + growth * (now - start):.3f}"
            lines.append(line)
        lines += [f'{STAMP}{{source="{source}"}} {now!r}' for source in SOURCES]
        return "\n".join(lines) + "\n"

    return body


def stamped(body: Callable[[float], str]) -> Callable[[float], str]:
    """`body`'s snapshot at one instant, each sample carrying that instant (ms) as its
    timestamp: Prometheus then stores the time the values are of, not the time its scrape
    began, and a rate over them has no serving delay in it (a loaded machine's can be large)."""
    offset = time.time() - time.monotonic()

    def at(_: float) -> str:
        ms = time.time_ns() // 1_000_000
        text = body(ms / 1000 - offset)
        return "".join(
            f"{line}\n" if not line or line.startswith("#") else f"{line} {ms}\n"
            for line in text.splitlines()
        )

    return at


def extrapolated_share(samples: list[tuple[float, float]], at: float, window: float) -> float:
    """Prometheus 3's rate() of a counter that grows evenly, over that growth: the share of
    `window` its extrapolation covers when evaluated at `at` (promql/functions.go
    extrapolatedRate; the range is left-open). `samples`: (seconds, value) of the series."""
    inside = [(t, v) for t, v in samples if at - window < t <= at]
    (first, v_first), (last, v_last) = inside[0], inside[-1]
    sampled = last - first
    average = sampled / (len(inside) - 1)
    to_start, to_end = first - (at - window), at - last
    if to_start >= 1.1 * average:
        to_start = average / 2
    if v_last > v_first and v_first >= 0:  # a counter does not extrapolate below zero
        to_start = min(to_start, sampled * v_first / (v_last - v_first))
    if to_end >= 1.1 * average:
        to_end = average / 2
    return (sampled + to_start + to_end) / window


def _values(text: str) -> Iterator[tuple[str, float]]:
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            yield key, float(value)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[float], str]], MetricsServer]]:
    servers: list[MetricsServer] = []

    def start(body: Callable[[float], str]) -> MetricsServer:
        servers.append(MetricsServer(body))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KUBENPUCTL), "top", *args], capture_output=True, text=True, timeout=60
    )


# --- what the recording says every row must show -------------------------------------------


def expected_rows() -> dict[tuple[str, ...], dict[str, float]]:
    """(namespace, pod, container, device, vendor) -> calls/s per kind, from record.RATES."""
    return {
        (*k, record.VENDOR[k[3]]): dict(zip(KINDS, map(float, rates), strict=True))
        for k, rates in record.RATES.items()
    }


def check_rates(rows: list[dict], scale: float, rel: float = 0.1, exact: bool = True) -> None:
    """Rows are the recorded pods with the recorded rates times `scale` (the recorded seconds
    over the measured ones), each within `rel`. `exact`: all with one and the same scale, which
    holds whatever the timing (not on screen, where rates are rounded for reading)."""
    want = expected_rows()
    got = {tuple(r[k] for k in top.POD_LABELS): r["calls_per_second"] for r in rows}
    assert set(got) == set(want)
    measured = [got[k][kind] / v for k, kinds in want.items() for kind, v in kinds.items() if v]
    if exact:
        assert max(measured) == pytest.approx(min(measured), rel=1e-3)
    assert all(m == pytest.approx(scale, rel=rel) for m in measured), measured
    assert all(got[k][kind] == 0 for k, kinds in want.items() for kind, v in kinds.items() if not v)


def by_total(rows: list[dict]) -> list[str]:
    return [f"{r['namespace']}/{r['pod']}/{r['container']}" for r in rows]


TOTAL_ORDER = [
    "ml/trainer-0/main",
    "ml/trainer-1/main",
    "vision/infer-7f9c4-x2kq/server",
    "vision/infer-7f9c4-x2kq/sidecar",
    "//",  # host processes: empty pod labels
    "batch/etl-0/worker",
]


# --- script mode -----------------------------------------------------------------------------


def test_once_json_rows_rates_and_order(serve):
    server = serve(sequence(fixture("agent-0.prom"), fixture("agent-1.prom")))
    result = ctl("--once", "--interval", "1", "--output", "json", "--url", server.url)
    assert (result.returncode, result.stderr) == (0, "")
    rows = json.loads(result.stdout)
    elapsed = server.served[1] - server.served[0]
    check_rates(rows, record.SECONDS / elapsed)
    assert by_total(rows) == TOTAL_ORDER  # ml/old-job-0 went between the scrapes: no row
    assert set(rows[0]) == {"namespace", "pod", "container", "device", "vendor", "calls_per_second"}
    assert rows[0]["device"] == record.GPU and rows[0]["vendor"] == "i915"


def test_counter_reset_counts_from_zero(serve):
    """The agent restarted between the scrapes: its counters started again from zero."""
    server = serve(sequence(fixture("agent-1.prom"), fixture("restart.prom")))
    result = ctl("--once", "--interval", "1", "-o", "json", "--url", server.url)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    check_rates(rows, record.SECONDS / (server.served[1] - server.served[0]))


def test_fdinfo_columns_appear_when_exported(serve):
    server = serve(sequence(fixture("fdinfo-0.prom"), fixture("fdinfo-1.prom")))
    result = ctl("--once", "--interval", "1", "-o", "json", "--url", server.url)
    assert result.returncode == 0, result.stderr
    rows = {(r["pod"], r["container"]): r for r in json.loads(result.stdout)}
    check_rates(list(rows.values()), record.SECONDS / (server.served[1] - server.served[0]))
    # Busy % over the same interval as the calls: exact relative to them.
    scale = rows[("trainer-0", "main")]["calls_per_second"]["submit"] / 400
    busy = rows[("trainer-0", "main")]["busy_percent"]
    assert set(busy) == {"render", "video"}
    assert busy["render"] == pytest.approx(90 * scale, rel=1e-3)
    assert busy["video"] == pytest.approx(5 * scale, rel=1e-3)
    assert rows[("infer-7f9c4-x2kq", "server")]["busy_percent"]["compute"] == pytest.approx(
        75 * scale, abs=2e-3
    )
    assert rows[("infer-7f9c4-x2kq", "server")]["memory_bytes"] == {"local": {"total": 96 << 20}}
    assert rows[("trainer-0", "main")]["memory_bytes"]["system"]["resident"] == 3 << 29
    assert rows[("etl-0", "worker")]["busy_percent"] == {}


def with_energy(text: str, joules: float) -> str:
    """An fdinfo snapshot whose trainer-0 holds `joules` of its device's energy."""
    labels = 'container="main",device="0000:00:02.0",namespace="ml",pod="trainer-0",vendor="i915"'
    return (
        text
        + "# TYPE kubenpu_energy_joules counter\n"
        + f"kubenpu_energy_joules_total{{{labels}}} {joules}\n"
    )


def test_power_column_is_the_rate_of_each_pods_energy(serve):
    before, after = fixture("fdinfo-0.prom"), fixture("fdinfo-1.prom")
    server = serve(
        sequence(with_energy(before, 100.0), with_energy(after, 100.0 + 30 * record.SECONDS))
    )
    result = ctl("--once", "--interval", "1", "-o", "json", "--url", server.url)
    assert result.returncode == 0, result.stderr
    rows = {(r["pod"], r["container"]): r for r in json.loads(result.stdout)}
    scale = (
        rows[("trainer-0", "main")]["calls_per_second"]["submit"] / 400
    )  # 400 submits/s were recorded
    assert rows[("trainer-0", "main")]["power_watts"] == pytest.approx(30 * scale, rel=1e-3)
    assert rows[("etl-0", "worker")]["power_watts"] is None  # no energy series: not 0 W
    table = ctl("--once", "--interval", "1", "--url", server.url).stdout.splitlines()
    assert next(line for line in table if line.startswith("NAMESPACE")).split()[-2:] == ["MEM", "W"]


def test_once_table(serve):
    server = serve(sequence(fixture("fdinfo-0.prom"), fixture("fdinfo-1.prom")))
    result = ctl("--once", "--interval", "1", "--url", server.url, "--sort", "pod")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("kubenpu top - node worker-1 - agent 0.1.0 - every 1s")
    assert lines[1] == "devices (2): 0000:00:02.0 i915, 0000:00:0b.0 ivpu"
    assert lines[4].split() == [
        *("NAMESPACE", "POD*", "CONTAINER", "DEVICE", "VENDOR", "TOTAL", "SUBMIT/s", "ALLOC/s"),
        *("WAIT/s", "COMPUTE%", "RENDER%", "VIDEO%", "MEM"),
    ]
    pods = [line.split()[1] for line in lines[5:]]
    assert pods == ["-", "etl-0", *["infer-7f9c4-x2kq"] * 2, "trainer-0", "trainer-1"]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("closed", r"cannot reach http://127\.0\.0\.1:\d+/metrics: Connection refused"),
        ("404", r"http://127\.0\.0\.1:\d+/nothing: HTTP 404 Not Found"),
        (
            "html",
            r"http://127\.0\.0\.1:\d+/metrics: no kubenpu_ metrics there \(not a KubeNPU agent\?\)",
        ),
        ("bad", r"cannot reach nonsense://x: unknown url type: nonsense"),
    ],
)
def test_dead_endpoint_is_one_line_and_exit_2(serve, url, message):
    server = serve(sequence("<html>hello</html>\n"))
    server_url = {
        "closed": f"http://127.0.0.1:{_closed_port()}/metrics",
        "404": server.url.replace("/metrics", "/nothing"),
        "html": server.url,
        "bad": "nonsense://x",
    }[url]
    result = ctl("--once", "--url", server_url)
    assert result.returncode == 2
    assert result.stdout == ""
    assert re.fullmatch(f"kubenpuctl: error: {message}\n", result.stderr), result.stderr


def _closed_port() -> int:
    return free_port()  # nothing listens there once it returns


def test_live_view_needs_a_terminal(serve):
    server = serve(sequence(fixture("agent-0.prom")))
    result = ctl("--url", server.url)
    assert result.returncode == 2
    assert result.stderr == (
        "kubenpuctl: error: the live view needs a terminal; use --once for scripts\n"
    )


def test_a_short_screen_says_how_many_rows_it_hides():
    before, _ = top.parse(fixture("agent-0.prom"))
    after, _ = top.parse(fixture("agent-1.prom"))
    frame = top.build_frame(top.Reading(after, top.counter_rates(before, after, 2.0)), False)

    class Source:
        url, multi_node = "http://node:8080/metrics", False

    view = _View(Source(), 2.0, "total", frame=frame)
    lines, titles = view.lines(60, 10)
    assert len(lines) == 10 and titles == 4
    assert [line.split()[1] for line in lines[5:8]] == ["trainer-0", "trainer-1", "infer~-x2kq"]
    assert lines[8] == "... 3 more rows"
    assert lines[9].startswith("sort total descending | keys:")
    assert view.key(ord("w")) and view.sort == "wait"
    assert not view.key(ord("q"))


def key_effects() -> dict[str, str]:
    """What each one-byte key does to a view: the sort it picks, "reverse" or "quit"; keys that
    do nothing are left out. The view starts on no sort and reversed, so every key shows."""

    class Source:
        url, multi_node = "http://node:8080/metrics", False

    effects = {}
    for ch in range(256):
        view = _View(Source(), 2.0, "", reverse=True)
        if not view.key(ch):
            effects[chr(ch)] = "quit"
        elif view.sort or not view.reverse:
            effects[chr(ch)] = view.sort or "reverse"
    return effects


def test_the_help_names_every_key_the_view_handles():
    effects = key_effects()
    assert {"t": "total", "u": "queue", "r": "reverse", "\x1b": "quit"}.items() <= effects.items()
    assert {c: effects[ALIASES.get(c, c)] for c in effects} == effects  # an alias does as its key
    assert set(top.SORTS) <= set(effects.values())  # no sort lost its key to another
    helped = dict(re.findall(r"(\S) (\S+)", HELP.removeprefix("keys: ")))
    assert helped == {c: does for c, does in effects.items() if c not in ALIASES}


# --- the parser --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.prom")))
def test_parser_reads_what_prometheus_client_reads(name):
    text = fixture(name)
    ours, malformed = top.parse(text)
    theirs = [
        (s.name, s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    ]
    assert malformed == 0
    assert [tuple(s) for s in ours] == theirs


def test_parser_escapes_and_malformed_lines():
    text = (
        'a{x="q\\"uo,te",y="back\\\\slash\\nnl"} 1.5 1700000000000\n'
        "b 2\n"
        'c{x="unterminated} 3\n'
        "d{} 4\n"
        "e notanumber\n"
        "f +Inf\n"
    )
    series, malformed = top.parse(text)
    assert series == [
        top.Series("a", {"x": 'q"uo,te', "y": "back\\slash\nnl"}, 1.5),
        top.Series("b", {}, 2.0),
        top.Series("d", {}, 4.0),
        top.Series("f", {}, float("inf")),
    ]
    assert malformed == 2


# --- in a terminal -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tmux() -> str:
    return script_output("tmux.sh")


class Terminal:
    """One tmux session running a command, on a private tmux server."""

    def __init__(self, tmux: str, tmp: Path, width: int, height: int, command: list[str]) -> None:
        self._base = [tmux, "-S", str(tmp / "tmux.sock"), "-f", str(tmp / "tmux.conf")]
        (tmp / "tmux.conf").write_text("set -g remain-on-exit on\n")
        size = ["-x", str(width), "-y", str(height)]
        # LINES/COLUMNS from the caller would override the terminal's size in curses.
        env = ["env", "-u", "LINES", "-u", "COLUMNS", "TERM=screen", "LANG=C.UTF-8"]
        self._tmux("new-session", "-d", *size, "-s", "top", *env, *command)

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            [*self._base, *args], check=True, capture_output=True, text=True, timeout=30
        ).stdout

    def screen(self) -> list[str]:
        return self._tmux("capture-pane", "-p", "-t", "top").rstrip("\n").split("\n")

    def press(self, key: str) -> None:
        self._tmux("send-keys", "-t", "top", key)

    def dead(self) -> bool:
        return self._tmux("display-message", "-p", "-t", "top", "#{pane_dead}").strip() == "1"

    def wait_for(self, ready: Callable[[list[str]], bool], timeout: float = 60) -> list[str]:
        """Poll the screen (bounded) until `ready` holds on a whole frame: the same screen
        twice in a row, not one caught while top redraws it (on a loaded machine a capture can
        hold rows of two frames). Fail with what the screen showed."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self.screen()
            if ready(lines) and self.screen() == lines:
                return lines
            assert time.monotonic() < deadline, "\n".join(lines)
            time.sleep(0.2)

    def close(self) -> None:
        subprocess.run([*self._base, "kill-server"], capture_output=True, timeout=30)


def table_rows(lines: list[str]) -> tuple[list[str], list[dict[str, str]]]:
    """The column titles and the rows below them, as a person reads the screen."""
    at = next(i for i, line in enumerate(lines) if line.startswith("NAMESPACE"))
    # Columns are two spaces apart; a title (IDLE FOR) or a cell (BEHIND's `ns/pod 73%`) may
    # hold one.
    titles = re.split(r" {2,}", lines[at].strip())
    rows = []
    for line in lines[at + 1 :]:
        cells = re.split(r" {2,}", line.strip())
        if len(cells) != len(titles):
            break
        rows.append(dict(zip([t.rstrip("*") for t in titles], cells, strict=True)))
    return titles, rows


def has_rates(lines: list[str]) -> bool:
    return any("calls/s" in line for line in lines) and any("trainer-0" in line for line in lines)


def screen_rates(rows: list[dict[str, str]]) -> list[dict]:
    """Screen rows as --once JSON rows, labelled with the recorded key each row shows (names
    may be elided, '-' is an empty label, devices lose domain 0000); a row that shows none of
    them keeps its screen cells, which check_rates then reports."""
    recorded = list(expected_rows())
    out = []
    for r in rows:
        cells = (r["NAMESPACE"], r["POD"], r["CONTAINER"], "0000:" + r["DEVICE"], "?")
        key = next((k for k in recorded if shows(r, k)), cells)
        out.append(dict(zip(top.POD_LABELS, key, strict=True)))
        out[-1]["calls_per_second"] = {k: float(r[f"{k.upper()}/s"]) for k in KINDS}
    return out


def save_capture(name: str, lines: list[str]) -> None:
    """KUBENPU_UPDATE_DOCS=1 writes the screen into docs/top.md between its markers."""
    if os.environ.get("KUBENPU_UPDATE_DOCS") != "1":
        return
    doc = REPO / "docs/top.md"
    begin, end = f"<!-- capture {name} -->\n", f"<!-- end {name} -->\n"
    text = doc.read_text()
    head, rest = text.split(begin)
    tail = rest.split(end)[1]
    screen = "\n".join(line.rstrip() for line in lines).rstrip("\n")
    doc.write_text(f"{head}{begin}```\n{screen}\n```\n{end}{tail}")


@pytest.fixture
def terminal(tmux, tmp_path) -> Iterator[Callable[..., Terminal]]:
    terms: list[Terminal] = []

    def start(width: int, height: int, *args: str) -> Terminal:
        terms.append(Terminal(tmux, tmp_path, width, height, [str(KUBENPUCTL), "top", *args]))
        return terms[-1]

    yield start
    for t in terms:
        t.close()


@pytest.mark.tools  # tmux, installed by scripts/tmux.sh
def test_live_view_80x24_sorts_on_key_press(serve, terminal):
    before, after = fixture("agent-0.prom"), fixture("agent-1.prom")
    server = serve(linear(before, after, record.SECONDS))
    term = terminal(80, 24, "--url", server.url, "--interval", "1")
    lines = term.wait_for(has_rates)
    assert lines[0].startswith("kubenpu top - node worker-1 - agent 0.1.0 - every 1s")
    assert lines[-1].startswith("sort total descending | keys: t total s submit a alloc")
    titles, rows = table_rows(lines)
    assert titles == [
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "DEVICE",
        *["TOTAL*", "SUBMIT/s", "ALLOC/s", "WAIT/s"],
    ]
    # With the rate titles' /s the table wants 82 of the 79 columns curses can fill: the
    # 16-character pod name loses its middle, no column goes.
    assert [r["POD"] for r in rows][2:4] == ["infer-~4-x2kq"] * 2
    shown = screen_rates(rows)
    check_rates(shown, 1.0, rel=0.01, exact=False)  # rated over the stamps: screen rounding only
    assert by_total(shown) == TOTAL_ORDER
    assert all(len(line) <= 80 for line in lines) and len(lines) == 24
    save_capture("80x24", lines)

    term.press("a")  # sort by alloc calls
    lines = term.wait_for(lambda ls: "sort alloc descending" in ls[-1])
    titles, rows = table_rows(lines)
    assert "ALLOC/s*" in titles
    assert [r["CONTAINER"] for r in rows][:3] == ["sidecar", "main", "main"]  # 30, 20, 5 /s
    term.press("p")  # then by pod name
    lines = term.wait_for(lambda ls: "sort pod ascending" in ls[-1])
    assert [r["POD"] for r in table_rows(lines)[1]] == [
        "-",
        "etl-0",
        *["infer-~c4-x2kq"] * 2,  # TOTAL lost its `*`: one character more for the name
        "trainer-0",
        "trainer-1",
    ]
    term.press("r")
    lines = term.wait_for(lambda ls: "sort pod descending" in ls[-1])
    assert table_rows(lines)[1][0]["POD"] == "trainer-1"
    term.press("q")
    term.wait_for(lambda _: term.dead())


@pytest.mark.tools  # tmux, installed by scripts/tmux.sh
def test_live_view_wide_with_fdinfo_columns(serve, terminal):
    server = serve(linear(fixture("fdinfo-0.prom"), fixture("fdinfo-1.prom"), record.SECONDS))
    term = terminal(160, 20, "--url", server.url, "--interval", "1")
    lines = term.wait_for(has_rates)
    titles, rows = table_rows(lines)
    assert titles == [
        *("NAMESPACE", "POD", "CONTAINER", "DEVICE", "VENDOR", "TOTAL*", "SUBMIT/s", "ALLOC/s"),
        *("WAIT/s", "COMPUTE%", "RENDER%", "VIDEO%", "MEM"),
    ]
    check_rates(screen_rates(rows), 1.0, rel=0.01, exact=False)
    trainer = next(r for r in rows if r["POD"] == "trainer-0")
    assert float(trainer["RENDER%"]) == pytest.approx(90, rel=0.01)
    assert (trainer["COMPUTE%"], trainer["MEM"]) == ("-", "1.5GiB")
    save_capture("160x20", lines)
    term.press("m")  # sort by memory
    lines = term.wait_for(lambda ls: "sort memory descending" in ls[-1])
    assert [r["MEM"] for r in table_rows(lines)[1]][:3] == ["1.5GiB", "256MiB", "96.0MiB"]


@pytest.mark.tools  # tmux, installed by scripts/tmux.sh
def test_live_view_survives_an_agent_going_away(serve, terminal):
    server = serve(linear(fixture("agent-0.prom"), fixture("agent-1.prom"), record.SECONDS))
    term = terminal(100, 30, "--url", server.url, "--interval", "1")
    term.wait_for(has_rates)
    server.close()
    lines = term.wait_for(lambda ls: any("last read failed" in line for line in ls))
    assert any("cannot reach" in line for line in lines)
    assert not term.dead()


# --- through Prometheus ------------------------------------------------------------------------


@pytest.mark.tools
def test_prometheus_source_across_nodes(serve, tmp_path):
    """A real Prometheus 3 scrapes two recorded agents (as the ServiceMonitor does, with a
    `node` label); top reads it through the query API."""
    before, after = (with_waits(fixture(f"agent-{i}.prom"), i * record.SECONDS) for i in (0, 1))
    growing = linear(before, after, record.SECONDS)
    nodes = {name: serve(stamped(growing)) for name in ("worker-1", "worker-2")}
    targets = "".join(
        f"  - targets: ['{s.url.split('/')[2]}']\n    labels: {{node: {name}}}\n"
        for name, s in nodes.items()
    )
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n- job_name: kubenpu\n"
        f"  static_configs:\n{targets}"
    )
    port = free_port()
    cmd = [
        str(receiver_tools() / "prometheus"),
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    for prom in run_server(cmd, port, tmp_path / "prometheus.log"):
        # rate() is right once the window holds samples all along: six scrapes in 6s.
        ioctl_series = 2 * 3 * len(record.RATES)
        full = prom.wait_for("count_over_time(kubenpu_ioctl_total[6s]) >= 6", ioctl_series)
        assert len(full) == ioctl_series
        asked = time.time()
        result = ctl("--prometheus", prom.url, "--window", "5", "--once", "-o", "json")
        answered = time.time()
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)
        check_extrapolated(rows, prom.query("kubenpu_ioctl_total[60s]"), (asked, answered), 5.0)
        for node in nodes:
            assert by_total([r for r in rows if r["node"] == node]) == TOTAL_ORDER
        assert {r["node"] for r in rows[:2]} == set(nodes)  # trainer-0, 800/s on each
        # BEHIND from rate() of the wait counters: their ratio, whatever the extrapolation (the
        # served values are rounded to the millisecond: 0.1 % of a 5 s window's increase).
        for r in rows:
            if r["pod"] == "trainer-1":
                share = pytest.approx(60, abs=0.1)
                assert r["behind"] == {"who": "ml/trainer-0", "share_percent": share}
            else:
                assert r["behind"] == {"who": None, "share_percent": None}

        table = ctl("--prometheus", prom.url, "--window", "5", "--once").stdout.splitlines()
        assert table[0].startswith("kubenpu top - node worker-1, worker-2 - agent 0.1.0")
        assert table[1] == "devices (4): 0000:00:02.0 i915, 0000:00:0b.0 ivpu"
        assert table[4].split()[:3] == ["NODE", "NAMESPACE", "POD"]
        assert len(table) == 5 + 2 * len(record.RATES)


def with_waits(text: str, seconds: float) -> str:
    """A snapshot whose trainer-1 has queued GPU jobs for `seconds` on top of 100 s: 0.3 s a
    second behind trainer-0, 0.1 behind itself and 0.1 on an idle ring (60 % behind trainer-0)."""
    place = 'container="main",device="0000:00:02.0",namespace="ml",pod="trainer-1",vendor="i915"'
    place += ',ring="rcs0"'
    lines = [
        f'{BEHIND}{{{place},behind_namespace="ml",behind_pod="{pod}"}} {100 + rate * seconds}'
        for pod, rate in (("trainer-0", 0.3), ("trainer-1", 0.1))
    ]
    lines.append(f"{IDLE_WAIT}{{{place}}} {100 + 0.1 * seconds}")
    return text + "\n".join([*lines, ""])


def check_extrapolated(
    rows: list[dict], stored: list[dict], asked: tuple[float, float], window: float
) -> None:
    """Each row's rate is its recorded rate times the share Prometheus's extrapolation covers:
    at least the least, at most the most over any time top may have asked (`asked`, to the
    millisecond), from the series' samples as Prometheus stored them. The bounds come from
    the scrapes' own times, so a loaded machine's late or missed scrapes widen them, and a
    rate outside them is top's error."""
    samples = {
        (s["metric"]["node"], *(s["metric"].get(k, "") for k in (*top.POD_LABELS, "kind"))): [
            (float(t), float(v)) for t, v in s["values"]
        ]
        for s in stored
    }
    start, end = (round(t * 1000) for t in asked)
    want, checked = expected_rows(), 0
    for r in rows:
        key = tuple(r[k] for k in top.POD_LABELS)
        assert key in want, key
        for kind, rate in want[key].items():
            got = r["calls_per_second"][kind]
            if not rate:
                assert got == 0
                continue
            series = samples[(r["node"], *key, kind)]
            shares = [extrapolated_share(series, ms / 1000, window) for ms in range(start, end + 1)]
            assert min(shares) * (1 - 1e-9) <= got / rate <= max(shares) * (1 + 1e-9), (key, kind)
            checked += 1
    assert checked == 2 * sum(1 for rates in want.values() for n in rates.values() if n)


def test_prometheus_source_unreachable_is_one_line():
    result = ctl("--prometheus", f"http://127.0.0.1:{_closed_port()}", "--once")
    assert result.returncode == 2
    assert re.fullmatch(
        r"kubenpuctl: error: cannot reach http://127\.0\.0\.1:\d+/api/v1/query\?query=\S+: "
        r"Connection refused\n",
        result.stderr,
    )


# --- a real agent's recording ------------------------------------------------------------------
# tests/testdata/dashboards-recording.json: 7 scrapes of a real agent's /metrics in the VM (6.12)
# while pods made calls (docs/dashboards.md). Served in order, one scrape per GET; after the last,
# each GET repeats the last recorded step (its counters grow again by the same increase), so the
# view stays on the recording's last rates instead of falling to 0.

RECORDING = json.loads((REPO / "tests/testdata/dashboards-recording.json").read_text())
SCRAPES = [s["text"] for s in RECORDING["scrapes"]]


def replay(texts: list[str]) -> Callable[[float], str]:
    served = 0
    step = {k: v - dict(_values(texts[-2])).get(k, 0.0) for k, v in _values(texts[-1])}

    def body(now: float) -> str:
        nonlocal served
        served += 1
        if served <= len(texts):
            return texts[served - 1]
        again = served - len(texts)
        lines = []
        for line in texts[-1].splitlines():
            key, _, value = line.rpartition(" ")
            if not line.startswith("#") and key.split("{")[0] in top.RATED:
                line = f"{key} {float(value) + again * step[key]}"
            lines.append(line)
        return "\n".join(lines) + "\n"

    return body


def recorded_step(before: str, after: str) -> dict[tuple[str, ...], dict[str, float]]:
    """(namespace, pod, container, device, vendor) -> increase per kind from `before` to `after`,
    for every call series in `after`, and 0 per kind for a pod's device with fdinfo, allocation
    or job wait series only (the test driver's clients, a device held idle: rows without
    calls)."""
    old = {(s.name, frozenset(s.labels.items())): s.value for s in top.parse(before)[0]}
    rows: dict[tuple[str, ...], dict[str, float]] = {}
    for s in top.parse(after)[0]:
        if s.name in (top.BUSY, top.MEMORY, ALLOCATED, BEHIND, IDLE_WAIT):
            key = tuple(s.labels.get(k, "") for k in top.POD_LABELS)
            rows.setdefault(key, dict.fromkeys(KINDS, 0.0))
        if s.name == "kubenpu_ioctl_total":
            key = tuple(s.labels[k] for k in top.POD_LABELS)
            prev = old.get((s.name, frozenset(s.labels.items())), 0.0)
            rows.setdefault(key, dict.fromkeys(KINDS, 0.0))[s.labels["kind"]] = s.value - prev
    return rows


def total_order(step: dict[tuple[str, ...], dict[str, float]]) -> list[tuple[str, ...]]:
    """Highest total increase first; equal ones by their labels (as top breaks ties)."""
    return sorted(sorted(step), key=lambda k: sum(step[k].values()), reverse=True)


def recorded_value(text: str, name: str) -> float:
    return sum(s.value for s in top.parse(text)[0] if s.name == name)


def test_once_json_on_a_real_agents_recording(serve):
    """The last two scrapes hold every series the recording has (pods that finished stay)."""
    server = serve(replay(SCRAPES[-2:]))
    result = ctl("--once", "--interval", "1", "-o", "json", "--url", server.url)
    assert (result.returncode, result.stderr) == (0, "")
    rows = json.loads(result.stdout)
    keys = [tuple(r[k] for k in top.POD_LABELS) for r in rows]
    called = {
        k for text in SCRAPES for k, kinds in recorded_step("", text).items() if any(kinds.values())
    }
    used = set(recorded_step("", SCRAPES[-1])) - called  # fdinfo or allocation series, no calls
    assert used == {
        ("team-d", "render-0", "gpu", "platform:kubenpu_testdrm", ""),
        ("team-e", "idle-0", "main", "0000:00:02.0", ""),  # allocated, idle
        # GPU jobs on the test driver's ring (tests/testdata/dashboards_job_waits.py)
        ("team-a", "trainer-0", "main", "platform:kubenpu_testdrm", ""),
        ("team-b", "infer-7d9f", "server", "platform:kubenpu_testdrm", ""),
    }
    assert set(keys) == called | used and len(keys) == len(called | used)
    assert ("", "", "", "platform:vgem", "vgem") in called  # host processes: the no-pod row
    step = recorded_step(*SCRAPES[-2:])
    assert keys == total_order(step)
    # Each rate is the recorded increase over one interval, the same for all: exact ratios.
    seconds = {
        step[k][kind] / r["calls_per_second"][kind]
        for k, r in zip(keys, rows, strict=True)
        for kind in KINDS
        if step[k][kind]
    }
    assert max(seconds) == pytest.approx(min(seconds), rel=1e-3)
    assert all(
        r["calls_per_second"][kind] == 0
        for k, r in zip(keys, rows, strict=True)
        for kind in KINDS
        if not step[k][kind]
    )


def _shows(cell: str, label: str) -> bool:
    """A screen cell shows the label: whole, '-' when empty, or elided in the middle ('~')."""
    if cell == "-":
        return label == ""
    head, elided, tail = cell.partition("~")
    return cell == label or (bool(elided) and label.startswith(head) and label.endswith(tail))


def shows(row: dict[str, str], key: tuple[str, ...]) -> bool:
    """A screen row shows the (namespace, pod, container, device[, vendor]) key; devices lose
    the PCI domain 0000 on screen."""
    titles = ("NAMESPACE", "POD", "CONTAINER", "DEVICE", "VENDOR")[: len(key)]
    labels = (*key[:3], key[3].removeprefix("0000:"), *key[4:])
    return all(_shows(row.get(t, label), label) for t, label in zip(titles, labels, strict=True))


def shown_rows(lines: list[str], rows: list[dict], want: list[tuple[str, ...]]) -> list:
    """The prefix of `want` the screen has room for, after checking the rows show it."""
    below = next(i for i, line in enumerate(lines) if line.startswith("NAMESPACE")) + 1
    room = len(lines) - 1 - below  # every line down to the key line at the bottom
    if len(want) <= room:
        assert len(rows) == len(want), "rows missing"
    else:  # the last line of the room says how many did not fit
        assert len(rows) == room - 1, "rows missing"
        assert lines[below + len(rows)] == f"... {len(want) - len(rows)} more rows"
    assert all(shows(r, k) for r, k in zip(rows, want, strict=False)), (rows, want)
    return want[: len(rows)]


@pytest.mark.tools  # tmux, installed by scripts/tmux.sh
@pytest.mark.parametrize(("width", "height"), [(80, 24), (160, 24)])
def test_live_view_of_a_real_agents_recording(serve, terminal, width, height):
    server = serve(replay(SCRAPES))
    term = terminal(width, height, "--url", server.url, "--interval", "1")
    # The last pod to start (batch-6) on screen: the frame shows the recording's last step.
    lines = term.wait_for(lambda ls: has_rates(ls) and any("batch-6" in line for line in ls))
    last = SCRAPES[-1]
    assert lines[0].startswith(f"kubenpu top - node {RECORDING['node']} - agent 0.1.0 - every 1s")
    assert lines[1] == "devices (2): 0000:00:02.0 virtio_gpu, platform:vgem vgem"
    # The drops stay 0; the host processes' calls are the unattributed ones (not_pod), which go
    # on growing by the last step as the replay repeats it.
    assert "dropped 0 (0.0/s)" in lines[2]
    unattributed = float(re.search(r"unattributed (\d+) \(", lines[2]).group(1))
    grow = recorded_value(last, top.UNATTRIBUTED) - recorded_value(SCRAPES[-2], top.UNATTRIBUTED)
    assert ((unattributed - recorded_value(last, top.UNATTRIBUTED)) / grow).is_integer()
    titles, rows = table_rows(lines)
    # VENDOR is the first column to go: the recording's columns do not all fit in 160 either,
    # but there it is the only one gone.
    assert "VENDOR" not in titles
    assert {"QUEUE p99", "RUN p99", "BEHIND", "IDLE FOR"} <= set(titles) or width == 80
    # What a pod does to the device stays on a narrow terminal; per-kind rates go first.
    assert {"MEM"} <= set(titles) and ("BUSY%" in titles) == (width == 80)
    shown = [k for k in KINDS if f"{k.upper()}/s" in titles]
    assert shown == (list(KINDS)[: len(shown)] if width == 80 else list(KINDS))
    step = recorded_step(*SCRAPES[-2:])
    want = shown_rows(lines, rows, total_order(step))
    # Every rate shown is its recorded increase over top's interval: one scale for all, within
    # the screen's rounding to three digits (a narrow screen drops some rate columns).
    scales = [
        float(r[f"{kind.upper()}/s"]) / step[k][kind]
        for r, k in zip(rows, want, strict=True)
        for kind in shown
        if step[k][kind]
    ]
    assert all(s == pytest.approx(scales[0], rel=0.05) for s in scales), (scales, lines)
    assert all(
        float(r[f"{kind.upper()}/s"]) == 0
        for r, k in zip(rows, want, strict=True)
        for kind in shown
        if not step[k][kind]
    )
    assert all(len(line) <= width for line in lines) and len(lines) == height
    save_capture(f"real {width}x{height}", lines)

    term.press("p")  # by pod name
    lines = term.wait_for(lambda ls: "sort pod ascending" in ls[-1])
    by_pod = sorted(sorted(step), key=lambda k: k[1])  # equal pods: by their labels
    assert by_pod[: len(want)] != want  # the key press changes the order
    shown_rows(lines, table_rows(lines)[1], by_pod)
    term.press("q")
    term.wait_for(lambda _: term.dead())


def test_allocation_columns_from_a_real_agent(serve, tmp_path):
    """SHARES (the shares held) and IDLE FOR, from the real Agent with a PodResources server (the
    series of tests/test_allocations_alert.py): the pod that holds the device and never calls
    gets a row of its own, idle for the whole recording; the one that submits shows 0 s."""
    from test_allocations_alert import STEP, STEPS
    from test_allocations_alert import record as record_agent

    scrapes = record_agent(tmp_path)["scrapes"]
    server = serve(sequence(scrapes[-2]["text"], scrapes[-1]["text"]))
    result = ctl("--once", "--interval", "1", "--url", server.url, "--sort", "idle")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.startswith("NAMESPACE")))
    assert lines[head].split()[-3:] == ["SHARES", "IDLE", "FOR*"]
    assert "ALLOC/s" in lines[head].split()  # the alloc-class call rate is another column
    rows = [line.split() for line in lines[head + 1 :]]
    assert [(r[1], r[-2], r[-1]) for r in rows] == [
        ("idle-0", "1", top.fmt_duration((STEPS - 1) * STEP)),
        ("trainer-0", "1", "0s"),
    ]
    server = serve(sequence(scrapes[-2]["text"], scrapes[-1]["text"]))  # two reads again
    result = ctl("--once", "--interval", "1", "-o", "json", "--url", server.url)
    alloc = {r["pod"]: r["allocated"] for r in json.loads(result.stdout)}
    assert alloc == {
        "idle-0": {"shares": 1, "idle_for_seconds": (STEPS - 1) * STEP},
        "trainer-0": {"shares": 1, "idle_for_seconds": 0},
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (59, "59s"), (60, "1m"), (3599, "59m"), (3660, "1h01m")],
)
def test_idle_for_format(seconds, text):
    assert top.fmt_duration(seconds) == text


def test_top_imports_the_metric_catalogue_alone() -> None:
    """kubenpuctl top needs the metrics' names, not the agent's store of their counts."""
    code = "import sys, kubenpu.cli.top; print(sorted(m for m in sys.modules if 'metrics' in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['kubenpu.metrics', 'kubenpu.metrics.catalogue']"


def every_family(joules: float, text: str) -> str:
    """An fdinfo snapshot with energy, an allocation, call durations and GPU jobs for
    trainer-0: every column top has (`joules` also sets the waits timed, their errors and the
    jobs)."""
    place = 'container="main",device="0000:00:02.0",namespace="ml",pod="trainer-0"'
    alloc = f'{place},resource="gpu.intel.com/i915"'
    wait = f'{place},vendor="i915",kind="wait"'
    hist = "kubenpu_ioctl_duration_seconds_bucket"
    job = f'{place},vendor="i915",ring="rcs0"'
    return with_energy(text, joules) + (
        f"kubenpu_device_allocated{{{alloc}}} 1\n"
        f"kubenpu_device_allocated_idle_for_seconds{{{alloc}}} 0\n"
        f'{hist}{{{wait},le="0.00390625"}} {joules:.0f}\n'
        f'{hist}{{{wait},le="+Inf"}} {joules:.0f}\n'
        f'kubenpu_ioctl_errors_total{{{wait},error="ETIME"}} {joules / 10:.0f}\n'
        + "".join(
            f'kubenpu_job_{part}_duration_seconds_bucket{{{job},le="{le}"}} {joules:.0f}\n'
            for part in ("wait", "run")
            for le in ("0.015625", "+Inf")
        )
        + f'{BEHIND}{{{job},behind_namespace="ml",behind_pod="trainer-1"}} {joules / 100:.3f}\n'
        + f"{IDLE_WAIT}{{{job}}} {joules / 300:.3f}\n"
    )


def narrowing(frame: top.frames.Frame) -> list[str]:
    """The columns in the order they leave the table as the terminal narrows."""
    gone, last = [], None
    for width in range(250, 20, -1):
        header = top.render.table(frame, "total", width)[0]
        for two in ("IDLE FOR", "WAIT p99", "QUEUE p99", "RUN p99"):  # the titles of two words
            header = header.replace(two, two.replace(" ", "_"))
        titles = [t.replace("_", " ") for t in header.split()]
        if last is not None:
            gone += [t for t in last if t not in titles and t not in gone]
        last = titles
    return gone


def test_a_narrow_terminal_keeps_busy_memory_and_power_before_the_call_kinds():
    """At 80x24 top dropped the busy, memory and power columns and kept the call rates."""
    before = top.parse(every_family(100.0, fixture("fdinfo-0.prom")))[0]
    after = top.parse(every_family(100.0 + 30 * record.SECONDS, fixture("fdinfo-1.prom")))[0]
    rates = top.counter_rates(before, after, record.SECONDS)
    frame = top.build_frame(top.Reading(after, rates), multi_node=False)
    titles = top.render.table(frame, "total", 79)[0].split()
    assert {"BUSY%", "MEM", "W", "TOTAL*"} <= set(titles)
    assert not {"ALLOC/s", "WAIT/s"} & set(titles)
    doc = (REPO / "docs/top.md").read_text()
    order = re.search(r"the least useful columns go, in this order:\s+(.*?) \(", doc, re.S)[1]
    stated = [c.strip() for c in order.replace("\n", " ").split(",")]
    gone = narrowing(frame)
    assert gone[:2] == ["VENDOR", "COMPUTE%"]  # then BUSY% stands for the engines
    assert [c for c in gone if c in stated] == stated


def test_top_json_is_documented():
    """docs/cli.md lists every key of top's JSON rows, each number's key with its unit."""
    from test_ctl import check_documented

    before = top.parse(every_family(100.0, fixture("fdinfo-0.prom")))[0]
    after = top.parse(every_family(100.0 + 30 * record.SECONDS, fixture("fdinfo-1.prom")))[0]
    frame = top.build_frame(top.Reading(after, top.counter_rates(before, after, 5)), True)
    check_documented("top", top.render.rows_json(frame, "total", multi_node=True))


def test_names_are_printed_with_control_characters_escaped():
    """A pod name holding an escape sequence reached the terminal raw."""
    text = fixture("agent-1.prom").replace('pod="trainer-0"', 'pod="tr\x1b[2Jainer-0"')
    latest = top.parse(text)[0]
    frame = top.build_frame(top.Reading(latest, top.counter_rates(latest, latest, 1)), False)
    lines = top.render.table(frame, "total", 200)
    assert not any("\x1b" in line for line in lines)
    assert any("tr\\x1b[2Jainer-0" in line for line in lines)


def test_wait_p99_and_errors_come_from_the_duration_buckets_and_the_error_counters():
    """Two scrapes 2 s apart: the pod's waits rose by 200 in the interval, 199 of them within
    2^-4 s, 190 within 2^-8 s (classic buckets of the kernel's): p99 is the 2^-4 s bound; the
    4 failed calls are 2 a second. Another pod that did not wait has no p99."""
    labels = 'namespace="ml",pod="p",container="c",device="0000:03:00.0",vendor="amdgpu"'
    other = labels.replace('pod="p"', 'pod="q"')

    def scrape(waits: int, within_16ms: int, within_4ms: int, errors: int) -> str:
        h = "kubenpu_ioctl_duration_seconds_bucket"
        return "\n".join(
            [
                f'kubenpu_ioctl_total{{{labels},kind="wait"}} {waits}',
                f'kubenpu_ioctl_total{{{other},kind="wait"}} 0',
                f'{h}{{{labels},kind="wait",le="0.00390625"}} {within_4ms}',
                f'{h}{{{labels},kind="wait",le="0.0625"}} {within_16ms}',
                f'{h}{{{labels},kind="wait",le="+Inf"}} {waits}',
                f'{h}{{{other},kind="wait",le="+Inf"}} 0',
                f'kubenpu_ioctl_errors_total{{{labels},kind="wait",error="ETIME"}} {errors}',
                "",
            ]
        )

    before, _ = top.parse(scrape(100, 100, 100, 1))
    after, _ = top.parse(scrape(300, 299, 290, 5))
    frame = top.build_frame(top.Reading(after, top.counter_rates(before, after, 2.0)), False)
    rows = {r.key.pod: r for r in frame.rows}
    assert (rows["p"].wait_p99, rows["p"].errors) == (0.0625, 2.0)
    assert (rows["q"].wait_p99, rows["q"].errors) == (None, 0.0)
    cols = {c.title: c for c in columns(frame, multi_node=False)}
    assert cols["WAIT p99"].cell(rows["p"]) == "62.5" and cols["WAIT p99"].cell(rows["q"]) == "-"
    assert cols["ERR/s"].cell(rows["p"]) == "2.0"


def test_queue_and_run_p99_come_from_the_job_histograms():
    """A pod's jobs in the interval: 100, 98 of them queued within 2^-6 s and all within 1 s,
    all run within 2^-4 s: QUEUE p99 is the 1 s bound, RUN p99 the 2^-4 s one. A pod with no
    job in the interval shows none."""
    place = 'namespace="ml",pod="p",container="c",device="0000:03:00.0",vendor="amdgpu"'
    idle = place.replace('pod="p"', 'pod="q"')

    def scrape(jobs: int, quick: int) -> str:
        lines = [f'kubenpu_ioctl_total{{{p},kind="submit"}} 0' for p in (place, idle)]
        for part, bounds in (("wait", {"0.015625": quick, "1": jobs}), ("run", {"0.0625": jobs})):
            h = f"kubenpu_job_{part}_duration_seconds_bucket"
            lines += [f'{h}{{{place},ring="gfx",le="{le}"}} {n}' for le, n in bounds.items()]
            lines += [f'{h}{{{place},ring="gfx",le="+Inf"}} {jobs}']
            lines += [f'{h}{{{idle},ring="gfx",le="+Inf"}} 7']
        return "\n".join([*lines, ""])

    before, _ = top.parse(scrape(0, 0))
    after, _ = top.parse(scrape(100, 98))
    frame = top.build_frame(top.Reading(after, top.counter_rates(before, after, 2.0)), False)
    rows = {r.key.pod: r for r in frame.rows}
    assert (rows["p"].queue_p99, rows["p"].run_p99) == (1.0, 0.0625)
    assert (rows["q"].queue_p99, rows["q"].run_p99) == (None, None)
    cols = {c.title: c for c in columns(frame, multi_node=False)}
    assert (cols["QUEUE p99"].cell(rows["p"]), cols["RUN p99"].cell(rows["q"])) == ("1000", "-")


@pytest.mark.parametrize("seconds", [2.0, 7.0])  # 7: 99/7 < 0.99 * (100/7) in floating point
def test_a_bucket_holding_exactly_99_percent_is_the_p99(seconds: float):
    """99 of a pod's 100 jobs in the interval ran within 2^-4 s, the last within 1 s: RUN p99
    is the 2^-4 s bound, whatever the interval the rates are taken over."""
    place = 'namespace="ml",pod="p",container="c",device="0000:03:00.0",vendor="amdgpu"'

    def scrape(jobs: int, quick: int) -> str:
        h = "kubenpu_job_run_duration_seconds_bucket"
        lines = [f'kubenpu_ioctl_total{{{place},kind="submit"}} 0']
        for le, n in (("0.0625", quick), ("1", jobs), ("+Inf", jobs)):
            lines.append(f'{h}{{{place},ring="gfx",le="{le}"}} {n}')
        return "\n".join([*lines, ""])

    before, _ = top.parse(scrape(0, 0))
    after, _ = top.parse(scrape(100, 99))
    frame = top.build_frame(top.Reading(after, top.counter_rates(before, after, seconds)), False)
    [row] = frame.rows
    assert row.run_p99 == 0.0625


def test_a_pods_p99_is_over_the_jobs_of_all_its_rings():
    """A pod's 50 gfx jobs all ran within 2^-4 s; of its 150 compute jobs 148 did, 2 took up to
    1 s. Of its 200 jobs 198 (99 %) ran within 2^-4 s: RUN p99 is 2^-4 s, not the compute
    ring's own p99 (1 s), the last ring's, or the largest ring's."""
    place = 'namespace="ml",pod="p",container="c",device="0000:03:00.0",vendor="amdgpu"'
    h = "kubenpu_job_run_duration_seconds_bucket"

    def scrape(gfx: int, compute: int, slow: int) -> str:
        lines = [f'kubenpu_ioctl_total{{{place},kind="submit"}} 0']
        for ring, quick, jobs in (("gfx", gfx, gfx), ("compute", compute - slow, compute)):
            for le, n in (("0.0625", quick), ("1", jobs), ("+Inf", jobs)):
                lines.append(f'{h}{{{place},ring="{ring}",le="{le}"}} {n}')
        return "\n".join([*lines, ""])

    before, _ = top.parse(scrape(0, 0, 0))
    after, _ = top.parse(scrape(50, 150, 2))
    frame = top.build_frame(top.Reading(after, top.counter_rates(before, after, 2.0)), False)
    [row] = frame.rows
    assert row.run_p99 == 0.0625


def test_job_histograms_are_rated_over_the_jobs_stamp(serve):
    """The agent reads the calls every 5 s and the GPU jobs every fdinfo interval (10 s), each
    stamped as its own source: 50 jobs between two jobs stamps 10 s apart are 5 jobs/s, though
    the calls' stamp moved 5 s."""
    place = 'namespace="ml",pod="p",container="c",device="0000:03:00.0",vendor="amdgpu"'

    def scrape(kernel_at: float, jobs_at: float, jobs: int) -> str:
        stamp = "kubenpu_counters_read_timestamp_seconds"
        return "\n".join(
            [
                f'{stamp}{{source="kernel"}} {kernel_at}',
                f'{stamp}{{source="jobs"}} {jobs_at}',
                f'kubenpu_ioctl_total{{{place},kind="submit"}} {jobs}',
                f'kubenpu_job_run_duration_seconds_bucket{{{place},ring="gfx",le="+Inf"}} {jobs}',
                "",
            ]
        )

    server = serve(sequence(scrape(1000, 1000, 0), scrape(1005, 1010, 50)))
    source = top.ScrapeSource(server.url)
    source.read()
    rates = {s.name: s.value for s in source.read().rates or []}
    assert rates["kubenpu_job_run_duration_seconds_bucket"] == 5.0
    assert rates["kubenpu_ioctl_total"] == 10.0  # the calls over the kernel's 5 s


def test_latency_prints_one_pods_histogram_and_errors(serve, capsys):
    """kubenpuctl latency against a served /metrics: the pod's buckets (the calls in each, from
    the cumulative counts), its total, and its errors; another pod's series are left out; the
    JSON keys are docs/cli.md's."""
    labels = 'namespace="ml",pod="p",container="c",device="0000:03:00.0",vendor="v",kind="wait"'
    other = labels.replace('pod="p"', 'pod="q"')
    h = "kubenpu_ioctl_duration_seconds"
    text = "\n".join(
        [
            f'{h}_bucket{{{labels},le="9.5367431640625e-07"}} 1',
            f'{h}_bucket{{{labels},le="0.00390625"}} 5',
            f'{h}_bucket{{{labels},le="+Inf"}} 6',
            f"{h}_count{{{labels}}} 6",
            f"{h}_sum{{{labels}}} 0.25",
            f'{h}_bucket{{{other},le="+Inf"}} 9',
            f'kubenpu_ioctl_errors_total{{{labels},error="ETIME"}} 2',
            "",
        ]
    )
    server = serve(sequence(text, text))
    assert ctl_main(["latency", "ml/p", "--url", server.url]) == 0
    out = capsys.readouterr().out
    assert "ml/p c 0000:03:00.0 wait: 6 calls, 0.25 s" in out
    assert [line.split()[-2:] for line in out.splitlines() if "<=" in line] == [
        ["1", "#######"],
        ["4", "###########################"],
        ["1", "#######"],
    ]
    assert "errors: ETIME 2" in out
    assert ctl_main(["latency", "ml/p", "--url", server.url, "-o", "json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert [b["calls"] for b in row["buckets"]] == [1, 4, 1] and row["errors"] == {"ETIME": 2}
    from test_ctl import check_documented

    check_documented("latency", [row])
    assert ctl_main(["latency", "ml/none", "--url", server.url]) == 0
    said = capsys.readouterr().out
    assert said.startswith("ml/none: no timed calls. An agent times counted calls")
    assert "kretprobe without CAP_SYS_ADMIN" in said and "probe.durations_exit is syscall" in said
    assert ctl_main(["latency", "no-slash", "--url", server.url]) == 2


def test_an_answer_past_the_bound_is_one_error(serve, monkeypatch):
    """A URL that is no agent may send without end: the read stops at MAX_ANSWER_BYTES."""
    monkeypatch.setattr(sources, "MAX_ANSWER_BYTES", 1000)
    url = serve(lambda now: "kubenpu_x 1\n" * 84).url  # 1,008 bytes
    with pytest.raises(TopError, match=r"cannot read .*: the answer is larger than 1000 bytes"):
        ScrapeSource(url).read()
    assert ScrapeSource(serve(lambda now: "kubenpu_x 1\n" * 83).url).read().latest  # 996


def test_latency_keeps_a_recreated_pods_instances_apart(serve, capsys):
    """A recreated pod while its predecessor is still exported: the old uid's 10 calls and the
    new uid's 3 are two histograms, each headed by its uid, not whichever series came last."""
    place = 'namespace="ml",pod="p",container="c",device="0000:03:00.0",vendor="v",kind="wait"'
    h = "kubenpu_ioctl_duration_seconds"
    lines = []
    for uid, calls in (("old-uid", 10), ("new-uid", 3)):
        labels = f'{place},pod_uid="{uid}"'
        lines += [
            f'{h}_bucket{{{labels},le="0.00390625"}} {calls}',
            f'{h}_bucket{{{labels},le="+Inf"}} {calls}',
            f"{h}_count{{{labels}}} {calls}",
            f"{h}_sum{{{labels}}} 0.5",
        ]
    text = "\n".join([*lines, ""])
    server = serve(sequence(text, text))
    assert ctl_main(["latency", "ml/p", "--url", server.url, "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["pod_uid"]: r["calls"] for r in rows} == {"old-uid": 10, "new-uid": 3}
    assert ctl_main(["latency", "ml/p", "--url", server.url]) == 0
    out = capsys.readouterr().out
    assert "ml/p (uid old-uid) c 0000:03:00.0 wait: 10 calls" in out
    assert "ml/p (uid new-uid) c 0000:03:00.0 wait: 3 calls" in out


def test_the_header_shows_the_calls_held_for_the_cri(serve, tmp_path):
    """A wrong CRI socket once showed as 0 calls/s and no rows for attribution.pending_seconds:
    the calls were held, and nothing on screen said so. The agent's own store and exporter."""
    metrics, clock = table(300, 100), Clock()
    attributor = Attributor([VGEM], FakeResolver(), metrics, clock=clock)  # never answers
    tally = Tally(100)
    tally.add(Key(9, 226, 0, 1), 40)
    attributor.flush(tally.drain())
    clock.now += 35
    attributor.flush(tally.drain())
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(metrics, build_resource(make_config(tmp_path, ""))))
    server = serve(sequence(generate_latest(registry).decode()))
    result = ctl("--once", "--interval", "1", "--url", server.url)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[2].endswith("  held for the CRI 40 (oldest 35s)")
    attributor.settle_all()
    server = serve(sequence(generate_latest(registry).decode()))
    result = ctl("--once", "--interval", "1", "--url", server.url)
    assert "held" not in result.stdout.splitlines()[2]


# --- who is in my way: BEHIND and kubenpuctl contention ----------------------------------------

WAITER = 'namespace="ml",pod="p",container="c",device="0000:03:00.0",vendor="amdgpu"'


def waits(
    behind: dict[tuple[str, str, str, str], float],
    idle: dict[tuple[str, str], float],
    device_info: bool = True,
) -> str:
    """An agent's /metrics with the two wait counters: behind[(pod, ring, behind_namespace,
    behind_pod)] and idle[(pod, ring)] seconds, each pod a container c in namespace ml."""
    lines = ['kubenpu_device_info{device="0000:03:00.0",vendor="amdgpu"} 1'] if device_info else []
    for (pod, ring, ns, blocker), n in behind.items():
        place = WAITER.replace('pod="p"', f'pod="{pod}"')
        by = f'behind_namespace="{ns}",behind_pod="{blocker}"'
        lines.append(f'{BEHIND}{{{place},ring="{ring}",{by}}} {n}')
    for (pod, ring), n in idle.items():
        place = WAITER.replace('pod="p"', f'pod="{pod}"')
        lines.append(f'{IDLE_WAIT}{{{place},ring="{ring}"}} {n}')
    return "\n".join([*lines, ""])


# Over one interval: p waited 6 s behind q over its two rings, 2 s behind itself, 1 s on an idle
# ring and 1 s behind the pods past the cap; r 3 s on an idle ring and 1 s behind q; s did not
# wait; t 5 s behind the pods past the cap and 2 s behind q; u 1 s behind each of two pods.
GROWTH = {
    ("p", "gfx", "ml", "q"): 3.0,
    ("p", "compute", "ml", "q"): 3.0,
    ("p", "gfx", "ml", "p"): 2.0,
    ("p", "gfx", "", "other"): 1.0,
    ("r", "gfx", "ml", "q"): 1.0,
    ("t", "gfx", "", "other"): 5.0,
    ("t", "gfx", "ml", "q"): 2.0,
    ("u", "gfx", "ml", "y"): 1.0,
    ("u", "gfx", "ml", "x"): 1.0,
}
# Before it, what each had waited already (s, all of its wait: it did not wait since).
BEFORE = dict.fromkeys(GROWTH, 0.0) | {
    ("p", "gfx", "ml", "q"): 10.0,
    ("p", "compute", "ml", "q"): 1.0,
    ("p", "gfx", "ml", "p"): 4.0,
    ("s", "gfx", "ml", "q"): 7.0,
}
AFTER = {key: seconds + GROWTH.get(key, 0.0) for key, seconds in BEFORE.items()}
IDLE_BEFORE = {("p", "gfx"): 2.0, ("r", "gfx"): 5.0, ("s", "gfx"): 1.0}
IDLE_AFTER = {("p", "gfx"): 3.0, ("r", "gfx"): 8.0, ("s", "gfx"): 1.0}


def behind_frame(seconds: float = 2.0) -> top.frames.Frame:
    before = top.parse(waits(BEFORE, IDLE_BEFORE))[0]
    after = top.parse(waits(AFTER, IDLE_AFTER))[0]
    return top.build_frame(top.Reading(after, top.counter_rates(before, after, seconds)), False)


def test_behind_is_the_pod_that_delayed_the_row_most_and_its_share():
    """Over its rings and the interval: p waited 6 of its 10 s behind q; r mostly on an idle
    ring; s not at all; t behind the pods past the agent's cap; u's tie goes to the name first
    in order, so the frames do not flicker between x and y."""
    frame = behind_frame()
    rows = {r.key.pod: r for r in frame.rows}
    cells = {pod: top.render.fmt_behind(r) for pod, r in rows.items()}
    assert cells == {
        "p": "ml/q 60%",
        "r": "idle 75%",
        "s": "-",
        "t": "other 71%",
        "u": "ml/x 50%",
    }
    # Shares are of the interval's wait, whatever its length.
    assert top.render.fmt_behind({r.key.pod: r for r in behind_frame(7.0).rows}["p"]) == "ml/q 60%"
    # Sorted by the share behind one pod (k): an idle ring is in no pod's way, so r is last.
    ordered = [r.key.pod for r in top.frames.sort_rows(frame.rows, "behind")]
    assert ordered == ["t", "p", "u", "r", "s"]


def test_behind_waits_for_two_reads_and_appears_only_with_the_counters():
    """The first read has no rates, and so no BEHIND value, but the column. An agent without the
    counters (probe.jobs off, or an older agent) has no BEHIND column."""
    latest = top.parse(waits(AFTER, IDLE_AFTER))[0]
    first = top.build_frame(top.Reading(latest, None), False)
    assert first.has_behind and [r.behind for r in first.rows if r.behind] == []
    assert "BEHIND" in top.render.table(first, "total", 200)[0]
    bare = top.parse(fixture("agent-1.prom"))[0]
    frame = top.build_frame(top.Reading(bare, top.counter_rates(bare, bare, 1)), False)
    assert "BEHIND" not in top.render.table(frame, "total", 200)[0]


def test_a_narrow_behind_keeps_the_pod_names_ends_and_the_share():
    """Where the names shrink BEHIND shrinks as they do, both ends kept: the share stays."""
    frame = behind_frame()
    wide = top.render.table(frame, "behind", 200)
    assert "BEHIND*" in wide[0]
    for width in (60, 50):
        lines = top.render.table(frame, "behind", width)
        at = lines[0].index("BEHIND*")
        cells = [line[at:].split("  ")[0].strip() for line in lines[1:]]
        assert all(c == "-" or c.endswith("%") for c in cells), cells
        assert max(len(line) for line in lines) <= width


def test_contention_lists_one_devices_pairs_over_a_window(serve, capsys):
    """kubenpuctl contention against a served /metrics: each waiting pod, ring and whom it waited
    behind, the seconds in the window (two reads) and their share of the pod's wait on that
    ring, the longest first; pairs that did not wait are left out. The device is named with or
    without its PCI domain; its JSON keys are docs/cli.md's."""
    server = serve(sequence(waits(BEFORE, IDLE_BEFORE), waits(AFTER, IDLE_AFTER)))
    assert ctl_main(["contention", "03:00.0", "--url", server.url, "--window", "0.1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["WAITER", "RING", "BEHIND", "SECONDS", "SHARE"]
    assert [line.split() for line in out[1:]] == [
        ["ml/t", "gfx", "other", "5.000", "71%"],
        ["ml/p", "compute", "ml/q", "3.000", "100%"],
        ["ml/p", "gfx", "ml/q", "3.000", "43%"],
        ["ml/r", "gfx", "idle", "3.000", "75%"],
        ["ml/p", "gfx", "ml/p", "2.000", "29%"],
        ["ml/t", "gfx", "ml/q", "2.000", "29%"],
        ["ml/p", "gfx", "idle", "1.000", "14%"],
        ["ml/p", "gfx", "other", "1.000", "14%"],
        ["ml/r", "gfx", "ml/q", "1.000", "25%"],
        ["ml/u", "gfx", "ml/x", "1.000", "50%"],
        ["ml/u", "gfx", "ml/y", "1.000", "50%"],
    ]
    server = serve(sequence(waits(BEFORE, IDLE_BEFORE), waits(AFTER, IDLE_AFTER)))
    argv = ["contention", "0000:03:00.0", "--url", server.url, "--window", "0.1", "-o", "json"]
    assert ctl_main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == {
        "namespace": "ml",
        "pod": "t",
        "ring": "gfx",
        "behind": "other",
        "wait_seconds": 5.0,
        "share_percent": 71.429,
    }
    from test_ctl import check_documented

    check_documented("contention", rows)
    # Per pod and ring the shares add up to the whole wait.
    shares: dict[tuple[str, str], float] = {}
    for r in rows:
        shares[r["pod"], r["ring"]] = shares.get((r["pod"], r["ring"]), 0) + r["share_percent"]
    assert shares == pytest.approx(dict.fromkeys(shares, 100.0), abs=0.01)


def test_contention_window_0_is_the_totals_since_the_agent_started(serve, capsys):
    server = serve(sequence(waits(AFTER, IDLE_AFTER)))
    assert ctl_main(["contention", "03:00.0", "--url", server.url, "--window", "0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["ml/p", "gfx", "ml/q", "13.000", "57%"]  # of 13 + 6 + 1 + 3
    assert len(server.served) == 1


@pytest.mark.parametrize(
    ("body", "argv", "status", "said"),
    [
        (
            waits(AFTER, IDLE_AFTER),
            ["00:02.0"],
            2,
            "kubenpuctl: error: no device 00:02.0 on this agent (its devices: 0000:03:00.0)",
        ),
        (
            waits({}, {}),
            ["03:00.0"],
            0,
            "0000:03:00.0: no GPU job waits exported for it (the agent's probe.jobs is off, or "
            "no job was ever queued on its rings: docs/jobs.md)",
        ),
        (
            waits(AFTER, IDLE_AFTER),
            ["03:00.0", "--window", "0.1"],
            0,
            "0000:03:00.0: no GPU job waited in its queues in the last 0.1 s",
        ),
        ("# not an agent\nup 1\n", ["03:00.0"], 2, "no kubenpu_ metrics there"),
    ],
    ids=["no such device", "not exported", "no wait in the window", "not an agent"],
)
def test_contention_says_why_there_is_nothing_in_one_line(serve, capsys, body, argv, status, said):
    server = serve(sequence(body))
    assert ctl_main(["contention", *argv, "--url", server.url]) == status
    out, err = capsys.readouterr()
    [line] = (err if status else out).splitlines()
    assert said in line


def test_contention_of_an_unreachable_agent_is_one_line(capsys):
    url = f"http://127.0.0.1:{_closed_port()}/metrics"
    assert ctl_main(["contention", "03:00.0", "--url", url]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"kubenpuctl: error: cannot reach {url}: Connection refused"


# --- placement: kubenpuctl placement -------------------------------------------------------------

GPU_ON_1 = "0000:22:01.0"
UIDS = {
    "far": "0e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a",
    "near": "1e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a",
    "exclusive": "2e6f7c3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a",
}


def remote_metrics(calls: dict[str, tuple[float, float]]) -> str:
    """An agent's /metrics: each pod's (calls, remote) on the GPU of node 1, in two kinds."""
    lines = [f'kubenpu_device_info{{device="{GPU_ON_1}",numa_node="1",vendor="virtio_gpu"}} 1']
    for pod, (n, remote) in calls.items():
        labels = (
            f'namespace="ml",pod="{pod}",pod_uid="{UIDS[pod]}",container="c",device="{GPU_ON_1}"'
        )
        for kind, part in (("submit", 0.75), ("wait", 0.25)):
            lines.append(f'kubenpu_ioctl_total{{{labels},kind="{kind}"}} {n * part}')
            lines.append(
                f'kubenpu_ioctl_remote_node_total{{{labels},kind="{kind}"}} {remote * part}'
            )
    return "\n".join([*lines, ""])


def node_tree(root: Path) -> Path:
    """A node's /sys: the GPU's local CPUs, and the kubelet's pod cgroups (systemd driver) with
    their cpusets: far on node 0's CPUs (besteffort), near on node 1's (burstable), exclusive
    (guaranteed) on node 0's."""
    (root / "sys/bus/pci/devices" / GPU_ON_1).mkdir(parents=True)
    (root / "sys/bus/pci/devices" / GPU_ON_1 / "local_cpulist").write_text("2-3\n")
    kubepods = root / "sys/fs/cgroup/kubepods.slice"
    for pod, parent, cpus in (
        ("far", "kubepods-besteffort.slice/kubepods-besteffort", "0-1"),
        ("near", "kubepods-burstable.slice/kubepods-burstable", "2-3"),
        ("exclusive", "kubepods", "0-1"),
    ):
        d = kubepods / f"{parent}-pod{UIDS[pod].replace('-', '_')}.slice"
        d.mkdir(parents=True)
        (d / "cpuset.cpus.effective").write_text(cpus + "\n")
    return root


def test_placement_explains_each_pods_remote_share_and_its_fix(serve, capsys, tmp_path):
    """kubenpuctl placement against a served /metrics and a node's /sys: per pod and device the
    remote share over the window (kinds and containers summed), the device's CPUs, the pod's
    cpuset and QoS class from its cgroup, and the fix for its class above 50%; the JSON keys
    are docs/cli.md's."""
    before = remote_metrics({"far": (100, 100), "near": (100, 0), "exclusive": (100, 50)})
    after = remote_metrics({"far": (2100, 2100), "near": (2100, 0), "exclusive": (1100, 950)})
    root = node_tree(tmp_path)
    server = serve(sequence(before, after))
    argv = ["placement", "--url", server.url, "--root", str(root), "--window", "0.1"]
    assert ctl_main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["POD", "DEVICE", "NODE", "REMOTE", "CALLS"]
    cells = [line.split()[:8] for line in out[1:]]
    assert cells == [
        ["ml/far", GPU_ON_1, "1", "100%", "2000", "2-3", "0-1", "besteffort"],
        ["ml/exclusive", GPU_ON_1, "1", "90%", "1000", "2-3", "0-1", "guaranteed"],
        ["ml/near", GPU_ON_1, "1", "0%", "2000", "2-3", "2-3", "burstable"],
    ]
    assert "taskset -c 2-3" in out[1] and "placement.scheduler: true" in out[1]
    assert "single-numa-node" in out[2] and "none needed" in out[3]
    server = serve(sequence(before, after))
    argv[2] = server.url
    assert ctl_main([*argv, "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["remote_percent"] == 100.0 and rows[0]["numa_node"] == 1
    from test_ctl import check_documented

    check_documented("placement", rows)


def test_placement_without_a_device_on_a_node_says_so_in_one_line(serve, capsys, tmp_path):
    server = serve(sequence('kubenpu_ioctl_total{namespace="ml",pod="p",device="d"} 5\n'))
    assert (
        ctl_main(["placement", "--url", server.url, "--root", str(tmp_path), "--window", "0"]) == 0
    )
    assert capsys.readouterr().out.startswith("no remote calls counted: no device has a NUMA node")
