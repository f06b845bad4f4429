#!/bin/bash
# PID 1 of the test guest, started by the initramfs in the Debian root. Mounts the kernel file
# systems the agent uses, loads the DRM drivers, runs the script named by kubenpu.run= on the
# kernel command line, stores its output in /out/guest.log and its exit code in /out/rc, and
# powers off. Setup failures go to /out/harness-error instead of rc, so run.sh can tell them
# apart from a failing test.
set -uo pipefail # no -e: whatever happens, PID 1 must reach the power-off

export PATH=/opt/kubenpu/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
# /src is read-only; unbuffered so the console shows Python output as it happens.
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 KUBENPU_VM=1

# Never returns. Spins instead of running sleep: the 9p root may already be gone, and PID 1
# must not exit (that panics the kernel).
power_off() {
  sync
  echo o >/proc/sysrq-trigger
  while :; do :; done
}

harness_error() {
  echo "guest-init: $*" | tee /out/harness-error
  power_off
}

# mount_fs TYPE DIR [OPTIONS]; skips what the initramfs already mounted. Bash tests rather than
# mkdir/mountpoint: every exec costs about 0.1 s under TCG.
mount_fs() {
  [[ $(</proc/self/mounts) == *" $2 "* ]] && return 0
  [[ -d $2 ]] || mkdir -p "$2"
  mount -t "$1" ${3:+-o "$3"} "$1" "$2" || harness_error "cannot mount $1 on $2"
}

mount_all() {
  mount_fs proc /proc
  mount_fs sysfs /sys
  mount_fs devtmpfs /dev
  mount_fs devpts /dev/pts
  mount_fs tmpfs /dev/shm mode=1777
  mount_fs cgroup2 /sys/fs/cgroup
  mount_fs bpf /sys/fs/bpf
  mount_fs tracefs /sys/kernel/tracing
  mount_fs debugfs /sys/kernel/debug
  mount_fs securityfs /sys/kernel/security
  mount_fs tmpfs /tmp mode=1777
  mount_fs tmpfs /run mode=755
  # As systemd leaves every node: mounts shared, which kubelet's HostToContainer propagation
  # (the chart's bpffs mount) needs from the runtime.
  mount --make-rshared / || harness_error "cannot make / shared"
}

# kubenpu.run=PATH: the kernel command line drops quotes, so it carries a path, not a command.
script_from_cmdline() {
  local arg
  for arg in $(</proc/cmdline); do
    [[ $arg == kubenpu.run=* ]] && echo "${arg#kubenpu.run=}"
  done
  return 0
}

main() {
  mount_all
  hostname kubenpu-vm
  ip link set lo up || harness_error "cannot bring up lo"
  # Card numbers follow load order: vgem is card0, virtio-gpu card1.
  modprobe vgem || harness_error "modprobe vgem failed"
  modprobe virtio_gpu || harness_error "modprobe virtio_gpu failed"

  local script
  script=$(script_from_cmdline)
  [[ -n $script ]] || harness_error "no kubenpu.run= on the kernel command line"
  [[ -f $script ]] || harness_error "no such script in the guest: $script"
  echo "guest-init: $(uname -r): running $script at uptime $(cut -d' ' -f1 /proc/uptime) s"
  cd /tmp || harness_error "no /tmp"
  if [[ -x $script ]]; then "$script"; else bash "$script"; fi 2>&1 | tee /out/guest.log
  local rc=${PIPESTATUS[0]}
  echo "guest-init: $script exited with $rc at uptime $(cut -d' ' -f1 /proc/uptime) s"
  echo "$rc" >/out/rc
  power_off
}

main
