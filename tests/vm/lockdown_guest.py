"""Under lockdown=confidentiality, `probe.attach: kprobe` must fail with the agent's one-line
error: BCC turns the probe's field reads into bpf_probe_read, a helper lockdown withholds.
Run by tests/vm/lockdown.sh after the e2e scenario; tests/test_e2e_vm.py asserts on the record.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from least_privilege_guest import attach_check


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "/out/kprobe")
    out.mkdir(parents=True, exist_ok=True)
    result = attach_check(out, (), "kprobe")  # as root with every capability
    result["lockdown"] = Path("/sys/kernel/security/lockdown").read_text().strip()
    dmesg = subprocess.run(["dmesg"], check=True, capture_output=True, text=True).stdout
    result["kernel_log"] = [line for line in dmesg.splitlines() if "Lockdown:" in line]
    (out / "result.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    print(f"kprobe under lockdown {result['lockdown']}: agent exit {result['rc']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
