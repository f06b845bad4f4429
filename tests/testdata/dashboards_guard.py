"""Adds the access guard's series to a dashboards recording that predates them
(docs/dashboards.md): a pod denied opens of a device it was not allocated (enforce), another's
would-be denied ioctls (audit), and opens by a pod cgroup the guard had not seen yet (unseen),
each a count that rises over the scrapes; and the policy those pods had.

usage: .venv/bin/python tests/testdata/dashboards_guard.py RECORDING.json (rewritten in place)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kubenpu.metrics.catalogue import ACCESS_DENIED, ACCESS_POLICY, ACCESS_UNCHECKED

TESTDRM, VIRTIO = "platform:kubenpu_testdrm", "0000:00:02.0"
E0, A0 = "3c0d5f6e-0000-4000-8000-0000000000e0", "3c0d5f6e-0000-4000-8000-0000000000a0"
# (namespace, pod, pod_uid, device, operation, mode): the count at each scrape.
DENIED = {
    ("team-e", "idle-0", E0, TESTDRM, "open", "enforce"): (
        0,
        1,
        1,
        2,
        3,
        3,
        3,
    ),
    ("team-a", "trainer-0", A0, VIRTIO, "ioctl", "audit"): (
        0,
        0,
        2,
        4,
        4,
        6,
        6,
    ),
}
UNCHECKED = {(TESTDRM, "open", "unseen"): (0, 1, 1, 1, 2, 2, 2)}
# (namespace, pod, pod_uid, device, mode, access): the policy, the same at each scrape.
POLICY = {
    ("team-e", "idle-0", E0, TESTDRM, "enforce", "denied"): (1,) * 7,
    ("team-e", "idle-0", E0, VIRTIO, "enforce", "allocated"): (1,) * 7,
    ("team-a", "trainer-0", A0, TESTDRM, "audit", "allow_rule"): (1,) * 7,
    ("team-a", "trainer-0", A0, VIRTIO, "audit", "denied"): (1,) * 7,
}


def lines(i: int) -> list[str]:
    """The three families' exposition at scrape `i`."""
    out = []
    families = ((ACCESS_DENIED, DENIED), (ACCESS_UNCHECKED, UNCHECKED), (ACCESS_POLICY, POLICY))
    for spec, rows in families:
        name = spec.prometheus_name
        out += [f"# HELP {name} {spec.description}", f"# TYPE {name} {spec.prometheus_kind}"]
        for key, counts in rows.items():
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(zip(spec.labels, key, strict=True)))
            out.append(f"{name}{{{labels}}} {float(counts[i])}")
    return out


def main(path: Path) -> None:
    raw = path.read_text()
    record = json.loads(raw)
    for i, scrape in enumerate(record["scrapes"]):
        scrape["text"] = scrape["text"].rstrip("\n") + "\n" + "\n".join(lines(i)) + "\n"
    path.write_text(json.dumps(record) + raw[len(raw.rstrip()) :])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
