"""What a uid-0 agent with few capabilities needs to read other processes' DRM fdinfo.

tests/vm/least_privilege_guest.py calls measure() in its boot, with its capability launcher, for
the plan's entries marked "fdinfo" ({"name", "caps", "fdinfo": true}). Two processes hold the
vgem node open: one as uid 1000 with no capabilities (a non-root pod), one as root with every
capability (a privileged pod). For each entry the real FdinfoReader scans both, under setpriv
with only `caps` in every set and no_new_privs (what a container gets from drop: [ALL] + add:
caps); OUT/<name>.json records which holders it could read. The same launch also reads every
device's telemetry (sysfs, hwmon: kubenpu.sources.sysfs) with the test driver loaded where the
kernel has it (issue 22): what it read and skipped by reason is the entry's "telemetry".
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from guestlib import load_testdrm

from kubenpu.discovery import discover

HOLD = (
    "import os, sys, time; os.open(sys.argv[1], os.O_RDWR); print('open', flush=True); "
    "time.sleep(600)"
)
SCAN = (
    "import json, sys\n"
    "from kubenpu.discovery import discover\n"
    "from kubenpu.sources.fdinfo import FdinfoReader\n"
    "for pid in sys.argv[1:]:\n"
    "    s = FdinfoReader(discover('/'), '/').scan([int(pid)])\n"
    "    print(json.dumps({'pid': int(pid), 'drm_fds': s.drm_fds,"
    " 'skipped': {str(k): v for k, v in s.skipped.items()}}))\n"
)
TELEMETRY = (
    "import json\n"
    "from kubenpu.discovery import discover\n"
    "from kubenpu.sources.sysfs import read_device\n"
    "readings = {d.id: read_device(d) for d in discover('/')}\n"
    "print(json.dumps({i: {'values': len(r.values), 'power_uw': r.power_uw,"
    " 'energy_uj': r.energy_uj, 'skipped': dict(r.skipped)} for i, r in readings.items()}))\n"
)
PYTHON = "/opt/kubenpu/venv/bin/python"


def holder(node: str, *prefix: str) -> subprocess.Popen[str]:
    argv = [*prefix, "python3", "-c", HOLD, node]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    return proc


def measure(out: Path, plan: list[dict], launcher: Callable[[list[str]], Sequence[str]]) -> None:
    """Each plan entry's scan of both holders, run under launcher(caps)."""
    testdrm_skipped = load_testdrm()
    (vgem,) = (d for d in discover("/") if d.vendor == "vgem")
    node = vgem.nodes[0].path
    os.chmod(node, 0o666)
    user = holder(node, "setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "--")
    root = holder(node)
    holders = {user.pid: "uid1000", root.pid: "root"}
    try:
        for run in plan:
            argv = [*launcher(run["caps"]), PYTHON, "-c", SCAN, *map(str, holders)]
            proc = subprocess.run(argv, capture_output=True, text=True, env={"PYTHONPATH": "/src"})
            lines = [json.loads(line) for line in proc.stdout.splitlines()]
            result = {holders[r["pid"]]: r for r in lines} | {"rc": proc.returncode}
            result["stderr"] = proc.stderr[-2000:]
            result["telemetry"] = _telemetry([*launcher(run["caps"]), PYTHON, "-c", TELEMETRY])
            result["testdrm_skipped"] = testdrm_skipped
            (out / f"{run['name']}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
            print(f"fdinfo privilege {run['name']} ({','.join(run['caps'])}): {result}")
    finally:
        user.kill()
        root.kill()


def _telemetry(argv: list[str]) -> dict:
    proc = subprocess.run(argv, capture_output=True, text=True, env={"PYTHONPATH": "/src"})
    if proc.returncode:
        return {"rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    return json.loads(proc.stdout)
