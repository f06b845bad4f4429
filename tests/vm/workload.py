"""A workload that makes a known number of DRM ioctls, run inside the VM.

    workload.py CGROUP_DIR PLAN_JSON

It first moves itself into CGROUP_DIR (a cgroup v2 directory), then for each step of the plan
opens the device node and issues the ioctl `count` times. Whether the driver accepts the call does
not matter: KubeNPU counts calls at drm_ioctl's entry, and every call here reaches it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys

_IOC_WRITE, _IOC_READ = 1, 2


def drm_iowr(nr: int, size: int) -> int:
    """DRM_IOWR(nr, size): _IOC(READ|WRITE, 'd', nr, size)."""
    return ((_IOC_READ | _IOC_WRITE) << 30) | (size << 16) | (ord("d") << 8) | nr


def call(fd: int, cmd: int, size: int) -> None:
    # A call the driver rejects has still passed drm_ioctl's entry: it counts.
    with contextlib.suppress(OSError):
        fcntl.ioctl(fd, cmd, bytearray(max(size, 8)))


def main() -> int:
    cgroup_dir, plan_path = sys.argv[1], sys.argv[2]
    with open(os.path.join(cgroup_dir, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    with open(plan_path) as f:
        plan = json.load(f)
    for step in plan:
        fd = os.open(step["path"], os.O_RDWR)
        try:
            cmd = step.get("cmd") or drm_iowr(step["nr"], step["size"])
            for _ in range(step["count"]):
                call(fd, cmd, step["size"])
        finally:
            os.close(fd)
    return 0


if __name__ == "__main__":
    sys.exit(main())
