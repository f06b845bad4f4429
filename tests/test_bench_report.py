"""bench/report.py renders what bench_guest.py measured; here with made-up figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "bench_report", Path(__file__).parents[1] / "bench" / "report.py"
)
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

HOOKS_ONLY = {
    "kernel": "6.12.117+deb13-amd64",
    "cpus": 2,
    "hooks_loop_calls": 20000,
    "hooks": {
        "none": {"tcgets": [1000.0, 1100.0, 900.0], "drm": [2000.0, 2000.0, 2200.0]},
        "security_file_ioctl": {"tcgets": [1500.0, 1500.0], "drm": [3000.0, 3000.0]},
        "drm_ioctl": {"tcgets": [1000.0, 1000.0], "drm": [2600.0, 2600.0]},
    },
}


def test_hook_rows_compare_each_hook_with_no_agent():
    text = report.render(HOOKS_ONLY, None)
    assert "| security_file_ioctl | 1500 | 1.50x | +500 | 3000 | 1.50x | +1000 |" in text
    assert "| drm_ioctl | 1000 | 1.00x | +0 | 2600 | 1.30x | +600 |" in text
    assert "| none (no agent) | 1000 | 1.00x | +0 | 2000 | 1.00x | +0 |" in text
    assert "Added cost per ioctl" not in text  # a --hooks run has no per-mode phases


RESTART_ONLY = {
    "kernel": "6.12.117+deb13-amd64",
    "cpus": 2,
    "pods": 1000,
    "restart": {
        "cold_first_metric_seconds": 52.0,
        "cold_rss_mib_start": 58.0,
        "cold_rss_mib_steady": 61.0,
        "tour": {"issued": 3000, "counted": 3000, "dropped": {}},
        "adopt_first_metric_seconds": 6.5,
        "adopt_rss_mib_start": 55.0,
        "adopt_rss_mib_steady": 60.0,
        "across": {"issued": 40010, "counted": 40010, "dropped": {}, "lost": 0},
    },
}


def test_restart_rows_show_start_times_memory_and_calls_lost():
    text = report.render(RESTART_ONLY, None)
    assert "| cold start, pinning (loader child) | 52.0 | 58 | 61 |  |" in text
    assert "| restart that adopts the pins | 6.5 | 55 | 60 | 0 of 40010 (dropped: 0) |" in text
    assert "no pinning" not in text  # a --restart run has no per-mode phases
