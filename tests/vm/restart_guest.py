"""Restarts of the agent under load, with the probe pinned in bpffs (docs/pinning.md).

Run by tests/vm/restart.sh in the QEMU guest; writes /out/result.json for
tests/test_restart_vm.py. One boot, one paced drmcall load per phase, one cgroup:
1. cold: agent A compiles, attaches and pins; load 1 starts; A is killed with SIGKILL while it
   runs; agent B (same config) adopts the pins while load 1 goes on. B's counted total must equal
   every call issued since A attached.
2. upgrade: load 2 starts; B stops (SIGTERM); agent C has another program (probe.ringbuf_pages),
   so it compiles while the pinned probe counts, then hands over: detaches the pinned probe and
   takes over its final totals. C is then killed and D (C's config) adopts: its total must equal
   C's, the retired probe's totals included.
3. uninstall: D stops, `kubenpu-agent --uninstall` removes the pins; no program of ours is left.
Times to the first metric (/readyz: attached and first read done) and each agent's RSS are
recorded for each start, all in this boot.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

from guestlib import PROMETHEUS, PY, SYNCOBJ_WAIT, Agent, Call, device_node, drmcall_argv, scrape

from kubenpu import bpfsys
from kubenpu.discovery import discover

RATE = 2000  # calls/s of each load
PIN_DIR = "/sys/fs/bpf/kubenpu"
CGROUP = Path("/sys/fs/cgroup/restart-load")


def config(ringbuf_pages: int = 256) -> dict:
    return {
        "probe": {"ringbuf_pages": ringbuf_pages, "pin_dir": PIN_DIR},
        "export": {"prometheus": PROMETHEUS},
    }


def first_metric(agent: Agent) -> float:
    """Seconds from the agent's start until it has attached (or adopted) and /metrics answers;
    its first kernel read follows within one attribution cycle (0.5 s)."""
    agent.attach()
    while agent.proc.poll() is None:
        try:
            scrape()
            return time.monotonic() - agent.started
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise SystemExit(f"agent exited; see {agent.log_file}")


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))


def counted() -> int:
    samples = scrape()
    return int(sum(s["value"] for s in samples.get("kubenpu_ioctl_total", [])))


def settled_count(expected: int, timeout: float = 30) -> int:
    """The agent's total once it reached `expected` or stopped moving for `timeout` s."""
    deadline = time.monotonic() + timeout
    seen = counted()
    while seen != expected and time.monotonic() < deadline:
        time.sleep(1)
        seen = counted()
    return seen


def start_load(node: str, calls: int) -> subprocess.Popen:
    argv = drmcall_argv([Call.drm(node, SYNCOBJ_WAIT, calls)], CGROUP, rate=RATE)
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL)


def pins() -> dict[str, list[str]]:
    return {d.name: sorted(os.listdir(d)) for d in Path(PIN_DIR).iterdir()}


def ours(before: set[str]) -> list[str]:
    return sorted(set(bpfsys.program_names()) - before)


def libbcc_mapped(pid: int) -> bool:
    """Whether BCC (and with it LLVM/clang) is in the process's memory."""
    return "libbcc" in Path(f"/proc/{pid}/maps").read_text()


def start(out: Path, name: str, cfg: dict) -> tuple[Agent, dict]:
    agent = Agent(out, cfg, name=name)
    seconds = first_metric(agent)
    return agent, {
        "first_metric_seconds": seconds,
        "rss_kib": rss_kib(agent.pid),
        "libbcc": libbcc_mapped(agent.pid),
    }


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/out")
    vgem = next(d for d in discover("/") if d.vendor == "vgem")
    node = device_node(vgem, "card")
    CGROUP.mkdir(exist_ok=True)
    before = set(bpfsys.program_names())
    result: dict = {"pins": {}}

    a, result["cold"] = start(out, "cold", config())
    result["pins"]["after_cold"] = pins()
    load = start_load(node, 30 * RATE)
    time.sleep(5)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    result["programs_after_kill"] = ours(before)
    time.sleep(3)  # calls made while no agent runs
    b, result["adopt"] = start(out, "adopt", config())
    load.wait()
    issued = 30 * RATE
    result["restart"] = {"issued": issued, "counted": settled_count(issued)}

    load = start_load(node, 90 * RATE)
    time.sleep(3)
    b.stop()
    c, result["upgrade"] = start(out, "upgrade", config(ringbuf_pages=512))
    result["pins"]["after_upgrade"] = pins()
    load.wait()
    issued += 90 * RATE
    result["upgrade"].update(issued=issued, counted=settled_count(issued))
    result["upgrade"]["dropped"] = scrape().get("kubenpu_events_dropped_total", [])
    c.proc.send_signal(signal.SIGKILL)
    c.proc.wait()
    d, result["readopt"] = start(out, "readopt", config(ringbuf_pages=512))
    result["readopt"]["counted"] = settled_count(result["upgrade"]["counted"])
    d.stop()

    result["programs_before_uninstall"] = ours(before)
    done = subprocess.run(
        [PY, "-m", "kubenpu.agent", "--config", str(d.config_file), "--uninstall"],
        capture_output=True,
        text=True,
    )
    result["uninstall"] = {"rc": done.returncode, "output": done.stdout + done.stderr}
    result["programs_after_uninstall"] = ours(before)
    result["pin_dir_exists"] = Path(PIN_DIR).exists()
    result["logs"] = {"cold": a.log(), "adopt": b.log(), "upgrade": c.log(), "readopt": d.log()}
    (out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
