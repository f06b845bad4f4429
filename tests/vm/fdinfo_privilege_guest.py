"""What a uid-0 agent with few capabilities needs to read other processes' DRM fdinfo.

tests/vm/least_privilege_guest.py calls measure() in its boot, with its capability launcher, for
the plan's entries marked "fdinfo" ({"name", "caps", "fdinfo": true}). Two processes hold the
vgem node open: one as uid 1000 with no capabilities (a non-root pod), one as root with every
capability (a privileged pod). For each entry the real FdinfoReader scans both, under setpriv
with only `caps` in every set and no_new_privs (what a container gets from drop: [ALL] + add:
caps); OUT/<name>.json records which holders it could read.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from kubenpu.discovery import discover

HOLD = (
    "import os, sys, time; os.open(sys.argv[1], os.O_RDWR); print('open', flush=True); "
    "time.sleep(600)"
)
SCAN = (
    "import json, sys\n"
    "from kubenpu.discovery import discover\n"
    "from kubenpu.fdinfo import FdinfoReader\n"
    "for pid in sys.argv[1:]:\n"
    "    s = FdinfoReader(discover('/'), '/').scan([int(pid)])\n"
    "    print(json.dumps({'pid': int(pid), 'drm_fds': s.drm_fds,"
    " 'skipped': {str(k): v for k, v in s.skipped.items()}}))\n"
)
PYTHON = "/opt/kubenpu/venv/bin/python"


def holder(node: str, *prefix: str) -> subprocess.Popen[str]:
    argv = [*prefix, "python3", "-c", HOLD, node]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
    return proc


def measure(out: Path, plan: list[dict], launcher: Callable[[list[str]], Sequence[str]]) -> None:
    """Each plan entry's scan of both holders, run under launcher(caps)."""
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
            (out / f"{run['name']}.json").write_text(json.dumps(result, indent=1, sort_keys=True))
            print(f"fdinfo privilege {run['name']} ({','.join(run['caps'])}): {result}")
    finally:
        user.kill()
        root.kill()
