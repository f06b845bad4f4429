"""The placement count's per-call cost (docs/placement.md, docs/performance.md): one boot of the
two-node machine (KUBENPU_VM_NUMA=1, the virtio GPU on node 1) with the guest's clock counting
instructions (KUBENPU_VM_ICOUNT), paired rounds of tight loops of a counted DRM call
(CREATE_DUMB on the GPU's card node) under each arm:
- none: no probe;
- before: the CO-RE aggregate object built before the count (/out/kubenpu-aggregate-before.bpf.o,
  bench/placement-before.sh), its devices given without a node, as it knew them;
- after: this tree's object, calls on CPU 0 (node 0: every call remote, both fields bumped);
- after local: this tree's object, calls on CPU 2 (the GPU's node);
- main, main local: where OUT holds kubenpu-aggregate-main.bpf.o (bench/placement-before.sh OUT
  REV main), the object of another revision of the count, calls on CPU 0 and 2 as above: two
  ways of counting compared in the same boot.
The probes are loaded in this process (CoreKernel, the LSM hook, durations off: the count alone).
Each round starts every arm afresh in an order reversed every other round; an arm's figure of a
round is the median of LOOPS loops; differences are taken round by round.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from guestlib import CREATE_DUMB, Call, drmcall_argv, reports

from kubenpu.discovery import discover
from kubenpu.kernel.core import CoreKernel

ROUNDS = int(os.environ.get("KUBENPU_PLACEMENT_ROUNDS", "8"))
LOOPS = 3
CALLS = 20000
CGROUP = Path("/sys/fs/cgroup/placement-bench")
MAIN = "kubenpu-aggregate-main.bpf.o"
ARMS = ("none", "before", "after", "after local", "main", "main local")
CPU = {"none": "0", "before": "0", "after": "0", "after local": "2", "main": "0", "main local": "2"}


def tight(card: str, cpu: str) -> float:
    """One tight loop of CALLS counted calls on `cpu`: ns per call (drmcall's own clock)."""
    call = Call.drm(card, CREATE_DUMB, CALLS)
    argv = ["taskset", "-c", cpu, *drmcall_argv([call], CGROUP)]
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    (step,) = reports(done.stdout, [call])
    return step["seconds"] / step["calls"] * 1e9


def probe(arm: str, out: Path) -> CoreKernel | None:
    devices = discover("/")
    if arm == "none":
        return None
    if arm == "before":  # the old layout has no node in the device table's value
        devices = [replace(d, numa_node=None) for d in devices]
    if arm.startswith(("before", "main")):
        path = out / f"kubenpu-aggregate-{arm.split()[0]}.bpf.o"
    else:
        path = None
    kernel = CoreKernel(devices, path=path, hook="security_file_ioctl", durations=False)
    kernel.start(lambda _: None)
    return kernel


def main(out: Path) -> int:
    CGROUP.mkdir(exist_ok=True)
    gpu = next(d for d in discover("/") if d.numa_node == 1)
    card = next(n.path for n in gpu.nodes if n.name.startswith("card"))
    arms = [a for a in ARMS if not a.startswith("main") or (out / MAIN).exists()]
    found: dict[str, list[float]] = {arm: [] for arm in arms}
    for r in range(ROUNDS):
        for arm in arms[:: 1 if r % 2 == 0 else -1]:
            kernel = probe(arm, out)
            try:
                loops = [tight(card, CPU[arm]) for _ in range(LOOPS)]
            finally:
                if kernel is not None:
                    kernel.close()
            found[arm].append(round(statistics.median(loops), 1))
        print(f"round {r + 1}/{ROUNDS}: {json.dumps(found)}", flush=True)
    result = {"kernel": os.uname().release, "calls": CALLS, "loops": LOOPS, "ns_per_call": found}
    (out / "placement-bench.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/out")))
