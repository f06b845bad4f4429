"""Every Grafana dashboard query, run by a real Prometheus on a real agent's recorded scrapes, and
every panel's units and column names read from the committed JSON.

tests/testdata/dashboards-recording.json is the recording the VM e2e made on 6.12 (see
docs/dashboards.md): the agent on a real kernel while pods and a host process made calls. This
runs without a VM, so a dashboard edit that breaks a query fails here in the unit run;
tests/test_e2e_vm.py runs the same check on a fresh recording.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import PODS_PANEL, dashboard_problems, dashboards

RECORDING = Path(__file__).parent / "testdata" / "dashboards-recording.json"
RATES = ("reqps", "ops")  # calls or items per second
# A gauge's unit from its name's unit suffix (Prometheus naming), as Grafana spells it.
GAUGE_UNITS = {
    "_celsius": "celsius",
    "_volts": "volt",
    "_watts": "watt",
    "_hertz": "hertz",
    "_bytes": "bytes",
    "_seconds": "s",
    "_ratio": "percentunit",
}
FLAGS = ("kubenpu_device_throttle_ratio",)  # 0/1 gauges


def expected_units(expr: str) -> tuple[str, ...]:
    """The units a query's values can be shown in, from what it computes: a ratio of two series
    is a fraction (in % with `100 *`); a rate of seconds is a fraction of the time, of joules
    watts, of a count per second; an increase is joules or a count; a gauge has its name's unit."""
    if " / " in expr:
        return ("percent",) if expr.startswith("100 *") else ("percentunit",)
    if "histogram_quantile(" in expr:
        return (gauge_unit(first_metric(expr).removesuffix("_bucket")),)
    applied = re.search(r"\b(rate|increase)\((kubenpu_\w+)", expr)
    func, metric = applied.groups() if applied else ("", first_metric(expr))
    base = metric.removesuffix("_total")
    if func == "rate":
        if base.endswith("_joules"):
            return ("watt",)
        return ("percentunit",) if base.endswith("_seconds") else RATES
    if func == "increase":
        return ("joule",) if base.endswith("_joules") else ("short",)
    return ("bool_on_off",) if metric in FLAGS else (gauge_unit(metric),)


def gauge_unit(metric: str) -> str:
    return next((u for suffix, u in GAUGE_UNITS.items() if metric.endswith(suffix)), "short")


def first_metric(expr: str) -> str:
    return re.search(r"\bkubenpu_\w+", expr).group(0)


def unit_problems(boards: dict[str, dict]) -> list[str]:
    return [
        f"{name}: {panel['title']} {ref}: {unit}, not {' or '.join(want)}"
        for name, board in boards.items()
        for panel in board["panels"]
        for t in panel["targets"]
        for ref, unit in dashboards.units(panel).items()
        if ref == t["refId"] and unit not in (want := expected_units(t["expr"]))
    ]


def test_every_panel_shows_its_values_in_their_unit():
    assert unit_problems(dashboards.boards()) == []


def test_a_wrong_unit_is_reported():
    """The check can fail: volts drawn as °C, and the 0/1 throttle flags as Hz (how the Devices
    board had them), a mixed panel without its override."""
    boards = dashboards.boards()
    panels = {p["title"]: p for p in boards["kubenpu-devices"]["panels"]}
    panels["Device voltage"]["fieldConfig"]["defaults"]["unit"] = "celsius"
    panels["Device throttling"]["fieldConfig"]["defaults"]["unit"] = "hertz"
    agents = {p["title"]: p for p in boards["kubenpu-agents"]["panels"]}
    agents["Series held and overflow"]["fieldConfig"]["overrides"] = []
    assert unit_problems(boards) == [
        "kubenpu-agents: Series held and overflow B: short, not reqps or ops",
        "kubenpu-devices: Device voltage A: celsius, not volt",
        "kubenpu-devices: Device throttling A: hertz, not bool_on_off",
    ]


def test_every_table_names_its_value_columns():
    """No column reads `Value` or `Value #A`: each query's values have a name (the Devices table
    hides its constant 1)."""
    unnamed = {
        (name, panel["title"], ref): column
        for name, board in dashboards.boards().items()
        for panel in board["panels"]
        if panel["type"] == "table"
        for ref, column in dashboards.value_columns(panel).items()
        if re.fullmatch(r"Value( #\w+)?", column)
    }
    assert unnamed == {}


def test_boards_lead_with_what_pods_use_and_keep_agent_health_apart():
    """The Pods board opens with device time, memory, power and idle allocations; the Devices
    board with power and temperature; the agents' own health has its own board."""
    boards = dashboards.boards()
    first = {
        name: [first_metric(p["targets"][0]["expr"]) for p in board["panels"][:5]]
        for name, board in boards.items()
    }
    assert first["kubenpu-pods"] == [
        "kubenpu_engine_busy_seconds_total",
        "kubenpu_memory_bytes",
        "kubenpu_energy_joules_total",
        "kubenpu_energy_joules_total",
        "kubenpu_device_allocated",
    ]
    assert first["kubenpu-devices"][:3] == [
        "kubenpu_device_info",
        "kubenpu_device_power_watts",
        "kubenpu_device_temperature_celsius",
    ]
    health = ("_errors_total", "_dropped_total", "_skipped_total", "_rebuilds_total", "_series")
    for name in ("kubenpu-pods", "kubenpu-devices"):
        exprs = [t["expr"] for p in boards[name]["panels"] for t in p["targets"]]
        assert [e for e in exprs if any(h in e for h in health)] == [], name


@pytest.mark.tools
def test_every_dashboard_query_returns_its_series(tmp_path):
    recording = json.loads(RECORDING.read_text())
    boards = dashboards.run_all(dashboards.tools(), recording, tmp_path)
    assert dashboard_problems(boards, recording) == []
    # docs/dashboards.md's table is what this run returns: it once lacked 8 queries.
    page = (Path(__file__).parents[1] / "docs" / "dashboards.md").read_text()
    start = page.index("| dashboard | panel | query | series | points |")
    assert page[start:].startswith(dashboards.table(boards) + "\n\n")


@pytest.mark.tools
def test_a_broken_query_is_reported(tmp_path, monkeypatch):
    """The check can fail: a panel naming a label the agent does not export shows up."""
    recording = json.loads(RECORDING.read_text())
    real = dashboards.boards

    def broken() -> dict:
        boards = real()
        (panel,) = [p for p in boards["kubenpu-pods"]["panels"] if p["title"] == PODS_PANEL]
        target = panel["targets"][0]
        target["expr"] = target["expr"].replace("(namespace, pod, kind)", "(namespace, pod, knd)")
        return boards

    monkeypatch.setattr(dashboards, "boards", broken)
    boards = dashboards.run_all(dashboards.tools(), recording, tmp_path)
    problems = dashboard_problems(boards, recording)
    assert problems and all(PODS_PANEL in p for p in problems), problems


def test_the_recorded_job_waits_are_conserved():
    """Per pod and ring, the seconds behind each pod and on an idle ring add up to the wait
    histogram's sum in every scrape: the rule the agent keeps (docs/jobs.md#who-is-in-my-way),
    so the "Who is in my way" shares of the recording add up to 100 %."""
    from prometheus_client.parser import text_string_to_metric_families

    checked = 0
    for scrape in json.loads(RECORDING.read_text())["scrapes"]:
        parts: dict[tuple, float] = {}
        sums: dict[tuple, float] = {}
        for family in text_string_to_metric_families(scrape["text"]):
            for s in family.samples:
                place = tuple(s.labels.get(k) for k in ("namespace", "pod", "container", "ring"))
                if s.name in (
                    "kubenpu_job_wait_behind_seconds_total",
                    "kubenpu_job_wait_idle_seconds_total",
                ):
                    parts[place] = parts.get(place, 0.0) + s.value
                elif s.name == "kubenpu_job_wait_duration_seconds_sum":
                    sums[place] = s.value
        assert parts == pytest.approx(sums, abs=1e-9)
        checked += len(sums)
    if not checked:  # a fresh recording of a VM run without probe.jobs
        pytest.skip("the recording has no GPU job waits")
