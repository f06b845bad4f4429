#!/bin/bash
# Guest script: checks that the harness gives what the probe needs (DRM nodes, BTF for drm,
# BCC fentry on drm_ioctl, the project importable from /src). Run from the host with
#   tests/vm/run.sh 6.12 tests/vm/smoke.sh
set -euo pipefail

echo "== kernel: $(uname -r), uptime $(cut -d' ' -f1 /proc/uptime) s"
echo "== lockdown: $(</sys/kernel/security/lockdown)"

echo "== /dev/dri (major:minor)"
stat -c '%n %Hr:%Lr' /dev/dri/*

echo "== /sys/class/drm cards"
for card in /sys/class/drm/card*; do
  [[ $card == *-* ]] && continue # connectors such as card1-Virtual-1
  device=$(readlink -f "$card/device")
  driver=$(readlink -e "$device/driver" || true) # vgem: a platform device without a driver link
  echo "$card dev=$(<"$card/dev") device=$device driver=${driver:-none}"
  for child in "$device"/virtio*; do
    [[ -e $child/driver ]] && echo "  ${child##*/} driver=$(readlink -f "$child/driver")"
  done
done

echo "== BTF"
for btf in vmlinux drm vgem virtio_gpu; do
  [[ -e /sys/kernel/btf/$btf ]] && echo "$btf: yes" || echo "$btf: no"
done

echo "== import kubenpu"
python -c 'import kubenpu, sys; print(kubenpu.__file__, sys.version.split()[0])'
python -c 'import kubenpu; assert kubenpu.__file__.startswith("/src/"), kubenpu.__file__'

echo "== BCC fentry on drm_ioctl"
python - <<'EOF'
import fcntl
import os
import struct
import time

t0 = time.monotonic()
from bcc import BPF  # noqa: E402

t_import = time.monotonic() - t0

ARGS = "struct file *filp, unsigned int cmd, unsigned long arg"
with open("/sys/kernel/btf/vmlinux", "rb") as f:
    in_vmlinux = b"\0drm_ioctl\0" in f.read()
if os.path.exists("/sys/kernel/btf/drm") and not in_vmlinux:
    probe = f"MODULE_KFUNC_PROBE(drm, drm_ioctl, {ARGS})"
else:
    probe = f"KFUNC_PROBE(drm_ioctl, {ARGS})"

TEXT = """
#include <linux/fs.h>
BPF_ARRAY(calls, u64, 1);
BPF_ARRAY(last_dev, u32, 1);
PROBE
{
    if ((bpf_get_current_pid_tgid() >> 32) != PID)
        return 0;
    u32 zero = 0;
    u64 *n = calls.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, 1);
    u32 dev = filp->f_inode->i_rdev;
    last_dev.update(&zero, &dev);
    return 0;
}
""".replace("PROBE", probe).replace("PID", str(os.getpid()))

t0 = time.monotonic()
b = BPF(text=TEXT)
t_compile = time.monotonic() - t0
print(f"probe: {probe.split('(')[0]}; import bcc {t_import:.1f} s")
print(f"compile+load+attach {t_compile:.1f} s")

# DRM_IOCTL_VERSION = _IOWR('d', 0x00, struct drm_version), 64 bytes on x86_64. With all lengths
# 0 the kernel copies no strings and fills in the version and the name's length.
DRM_IOCTL_VERSION = 0xC0406400
CALLS = 3
fd = os.open("/dev/dri/card0", os.O_RDWR)
for _ in range(CALLS):
    buf = bytearray(64)
    fcntl.ioctl(fd, DRM_IOCTL_VERSION, buf, True)
os.close(fd)
major, minor, patch, _pad, name_len = struct.unpack_from("iiiiQ", buf)
rdev = os.stat("/dev/dri/card0").st_rdev

seen = b["calls"][0].value
dev = b["last_dev"][0].value
print(f"card0: driver version {major}.{minor}.{patch}, name length {name_len}")
print(f"ioctls made {CALLS}, seen {seen}, dev {dev >> 20}:{dev & 0xFFFFF}")
assert seen == CALLS, f"fentry saw {seen} calls, expected {CALLS}"
assert (dev >> 20, dev & 0xFFFFF) == (os.major(rdev), os.minor(rdev)), "wrong dev_t"
print("smoke: OK")
EOF
