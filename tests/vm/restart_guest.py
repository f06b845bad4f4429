"""Restarts of the agent under load, with the probe pinned in bpffs (docs/pinning.md).

Run by tests/vm/restart.sh in the QEMU guest; writes /out/result.json for
tests/test_restart_vm.py. Every agent runs with the chart's capabilities for its hook and the
chart's probe.pin_dir (/out/plan.json, from the host test). One boot, one paced drmcall load per
phase, one cgroup:
1. cold (probe.loader: bcc): agent A has its loader child compile, attach and pin; load 1
   starts; A is killed with SIGKILL while it runs; agent B (same config) adopts the pins while
   load 1 goes on. B's counted total must equal every call issued since A attached.
2. upgrade, BCC to CO-RE: load 2 starts; B stops (SIGTERM); agent C loads the CO-RE object (the
   default loader, and another probe.ringbuf_pages) while the pinned BCC probe counts, then C
   hands over (gate protocol) and takes over the old probe's final totals. C is then killed
   and D (C's config) adopts: its total must equal C's, the retired probe's totals included.
3. crash mid-hand-over, CO-RE to BCC: load 3 starts; D stops; the loader of agent E
   (probe.loader bcc, probe.hook drm_ioctl) runs alone and pins E's probe with its gate closed
   (what a crash of E right after its child leaves), then the hand-over is cut inside its window
   (E's gate at hand-over, D's device table emptied, D still attached) as a crash there would
   leave it; a second load runs in that window, its calls handover drops. E then starts, adopts
   and finishes the hand-over.
4. uninstall: E stops, and the chart's uninstall hook command (as rendered, with its capability
   set: none; no config file) removes the pins: the pin directory is gone, and neither a program
   nor a link of ours is left (the kernel's own lists, as bpftool prog/link list reads them).
   Run again, it says there was nothing.
Times to the first metric (attach line and /metrics answering) and each agent's RSS are
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

from guestlib import (
    LINK_GET_NEXT_ID,
    PROMETHEUS,
    PY,
    SLOW,
    SYNCOBJ_WAIT,
    Agent,
    Call,
    by_reason,
    device_node,
    drmcall_argv,
    object_ids,
    scrape,
)
from least_privilege_guest import launcher

from kubenpu.discovery import discover
from kubenpu.kernel import abi, bpfsys
from kubenpu.kernel.maps import empty_devices

RATE = 2000  # calls/s of each load
CGROUP = Path("/sys/fs/cgroup/restart-load")
# {"pin_dir": ..., "caps": {hook: [...]}, "uninstall": {"command": [...], "caps": [...]}}
PLAN = json.loads(Path("/out/plan.json").read_text())
PIN_DIR = PLAN["pin_dir"]
# E's loader alone, with E's config: compile, attach with the gate closed, pin, exit.
LOADER = """
import sys
from pathlib import Path
from kubenpu import config
from kubenpu.discovery import discover
from kubenpu.kernel.loader import loaders
from kubenpu.kernel.child import load_in_child
from kubenpu.kernel.pinned import PinnedProbe
cfg = config.load(sys.argv[1])
devices = discover(cfg.discovery.root)
p = cfg.probe
settings = dict(loader=p.loader, mode=p.mode, hook=p.hook, attach=p.attach)
(kernel,) = loaders(devices, **settings, ringbuf_pages=p.ringbuf_pages)
probe = PinnedProbe(Path(cfg.probe.pin_dir), kernel, devices)
kernel.gate_open = False
print(probe.dir if load_in_child(kernel, probe.dir, probe.meta) else "")
"""


def config(
    ringbuf_pages: int = 256, hook: str = "security_file_ioctl", loader: str = "auto"
) -> dict:
    return {
        "probe": {
            "ringbuf_pages": ringbuf_pages,
            "pin_dir": PIN_DIR,
            "hook": hook,
            "loader": loader,
        },
        "export": {"prometheus": PROMETHEUS},
    }


def caps(cfg: dict) -> tuple[str, ...]:
    return launcher(PLAN["caps"][cfg["probe"]["hook"]])


def first_metric(agent: Agent) -> float:
    """Seconds from the agent's start until it has attached (or adopted) and /metrics answers;
    its first kernel read follows within one attribution cycle (0.5 s)."""
    agent.attach()
    while agent.proc.poll() is None:
        try:
            scrape(patience=0)  # this loop is the retry, timed
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


def settled_count(expected: int, timeout: float = 30 * SLOW) -> int:
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


def attached(pinned: list[str]) -> bool:
    return any(name.startswith("link-") for name in pinned)


def ours(before: set[str]) -> list[str]:
    return sorted(set(bpfsys.program_names()) - before)


def ours_once_released(before: set[str], seconds: float = 60) -> list[str]:
    """ours() after the kernel freed what the uninstall released: a program whose last link and
    pin are gone is freed after an RCU grace period, which under TCG can outlast the uninstall's
    return (seen once in a CI run: drm_ioctl still listed). What is still held stays listed."""
    deadline = time.monotonic() + seconds
    while (left := ours(before)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def link_ids() -> set[int]:
    """The id of every BPF link in the kernel (what `bpftool link list` walks)."""
    return set(object_ids(LINK_GET_NEXT_ID))


def uninstall_hook() -> dict:
    """The chart's uninstall hook's command, with its capabilities, and no config file."""
    hook = PLAN["uninstall"]
    argv = [*launcher(hook["caps"]), PY, "-m", "kubenpu.agent", *hook["command"][1:]]
    done = subprocess.run(argv, capture_output=True, text=True)
    return {"rc": done.returncode, "output": done.stdout + done.stderr}


def libbcc_mapped(pid: int) -> bool:
    """Whether BCC (and with it LLVM/clang) is in the process's memory."""
    return "libbcc" in Path(f"/proc/{pid}/maps").read_text()


def handover_drops() -> int:
    return int(by_reason(scrape(), "kubenpu_events_dropped_total").get("handover", 0))


def accounted(issued: int) -> dict:
    """The agent's total and handover drops once all `issued` calls are counted or dropped."""
    deadline = time.monotonic() + 30 * SLOW
    while True:
        seen, dropped = counted(), handover_drops()
        if seen + dropped >= issued or time.monotonic() > deadline:
            return {"issued": issued, "counted": seen, "handover": dropped}
        time.sleep(1)


def crash_mid_hand_over(out: Path, cfg: dict, old: str) -> str:
    """The pins a crash of agent `cfg` inside its hand-over from `old` leaves: its probe pinned
    by its loader child (gate closed), then its gate at hand-over and the old probe's device
    table emptied. Returns the new probe's directory."""
    cfg_file = out / "crash.yaml"
    cfg_file.write_text(json.dumps(cfg))
    done = subprocess.run(
        [*caps(cfg), PY, "-c", LOADER, str(cfg_file)], capture_output=True, text=True
    )
    (out / "crash-loader.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not done.stdout.strip():
        raise SystemExit(f"the loader did not pin; see {out}/crash-loader.log")
    new = Path(done.stdout.strip())
    gate = bpfsys.obj_get(new / abi.GATE)
    bpfsys.update(gate, abi.U32.pack(0), abi.U32.pack(abi.GATE_HANDOVER))
    old_dir = Path(PIN_DIR, old)  # the old probe stops counting
    empty_devices({name: bpfsys.obj_get(old_dir / name) for name in (abi.MINORS, abi.DEVICES)})
    return new.name


def start(out: Path, name: str, cfg: dict) -> tuple[Agent, dict]:
    agent = Agent(out, cfg, name=name, launcher=caps(cfg))
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
    links_before = link_ids()
    result: dict = {"pins": {}}

    a, result["cold"] = start(out, "cold", config(loader="bcc"))
    result["pins"]["after_cold"] = pins()
    load = start_load(node, 30 * RATE)
    time.sleep(5)
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait()
    result["programs_after_kill"] = ours(before)
    time.sleep(3)  # calls made while no agent runs
    b, result["adopt"] = start(out, "adopt", config(loader="bcc"))
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
    result["upgrade"].update(accounted(issued))
    c.proc.send_signal(signal.SIGKILL)
    c.proc.wait()
    d, result["readopt"] = start(out, "readopt", config(ringbuf_pages=512))
    result["readopt"].update(accounted(issued))

    (d_dir,) = (name for name, pinned in pins().items() if attached(pinned))
    load = start_load(node, 120 * RATE)
    time.sleep(3)
    d.stop()
    e_cfg = config(hook="drm_ioctl", loader="bcc")
    result["pins"]["crashed"] = crash_mid_hand_over(out, e_cfg, d_dir)
    # Calls in the cut hand-over window (handover drops), whatever the compile left of load 3:
    # under TCG on a busy machine E's loader child can outlast it.
    window = start_load(node, 20 * RATE)
    time.sleep(3)
    e, result["after_crash"] = start(out, "after_crash", e_cfg)
    result["pins"]["after_crash"] = pins()
    load.wait()
    window.wait()
    issued += 140 * RATE
    result["after_crash"].update(accounted(issued))
    e.stop()

    result["programs_before_uninstall"] = ours(before)
    result["links_before_uninstall"] = sorted(link_ids() - links_before)
    result["uninstall"] = uninstall_hook()
    result["programs_after_uninstall"] = ours_once_released(before)
    result["links_after_uninstall"] = sorted(link_ids() - links_before)
    result["pin_dir_exists"] = Path(PIN_DIR).exists()
    result["uninstall_again"] = uninstall_hook()
    result["logs"] = {
        "cold": a.log(),
        "adopt": b.log(),
        "upgrade": c.log(),
        "readopt": d.log(),
        "after_crash": e.log(),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
