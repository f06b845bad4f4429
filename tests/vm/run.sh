#!/usr/bin/env bash
# Boot one of the kernels of tests/vm/build.sh under QEMU (TCG) and run a script inside it.
#   tests/vm/run.sh KERNEL GUEST_SCRIPT [OUT_DIR] [-- EXTRA_KERNEL_ARGS...]
# GUEST_SCRIPT is a file in this repo (the guest sees the repo read-only at /src) or a path that
# only exists in the guest. OUT_DIR (default: a new directory under /tmp) is the guest's writable
# /out; it receives console.log (the whole serial console), guest.log (the script's output), rc,
# and harness-error when the guest setup failed. Extra kernel args go after `--`
# (e.g. lockdown=confidentiality).
# The guest scales its waits by kubenpu.slow=F on its command line: KUBENPU_VM_SLOW if set, else
# the host's 1-minute load per core at boot (at least 1; tests/vm/guestlib.py SLOW).
# Exit code: the script's; 124 when KUBENPU_VM_TIMEOUT (seconds; default 900 times kubenpu.slow)
# ran out; 125 when the guest never ran the script to the end (boot or setup failure).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
. "$repo/scripts/env.sh"
vm=$KUBENPU_CACHE/vm
timeout_s=${KUBENPU_VM_TIMEOUT:-}

die() {
  printf 'run.sh: %s\n' "$1" >&2
  exit "${2:-2}"
}

# How many times slower than alone the guest may run: the host's load per core, at least 1.
slowness() {
  if [[ -n ${KUBENPU_VM_SLOW:-} ]]; then
    echo "$KUBENPU_VM_SLOW"
  else
    awk -v cores="$(nproc)" '{ f = $1 / cores; printf "%.1f\n", (f > 1 ? f : 1) }' /proc/loadavg
  fi
}

usage() { die "usage: $0 KERNEL GUEST_SCRIPT [OUT_DIR] [-- EXTRA_KERNEL_ARGS...]"; }

# The guest's path for GUEST_SCRIPT: files of the repo map to /src, other absolute paths are
# taken as guest paths (e.g. /bin/true). Spaces cannot pass through the kernel command line.
guest_path() {
  local path=$1 abs
  [[ $path != *[[:space:]]* ]] || die "script path has spaces: $path"
  abs=$(realpath -m "$path")
  if [[ -f $path && $abs == "$repo"/* ]]; then
    echo "/src/${abs#"$repo"/}"
  elif [[ $path == /* ]]; then
    echo "$path"
  else
    die "no such script: $path"
  fi
}

# qemu's output, with the serial console's CRs removed, both on stdout and in console.log.
# Sets qemu_status to qemu's (or timeout's) exit status.
boot() {
  local kernel_dir=$1 out=$2 cmdline=$3
  # thread=single: with one host thread per vCPU, a boot oopsed on a stale int3 that the kernel's
  # live code patching (static keys; BPF trampolines use it too) had already removed. One thread
  # was no slower for serial work such as BCC's compile.
  # 9p: the root and the repo read-only (security_model=none: the host's owners and modes as they
  # are); /out writable, files created there by the guest's root are owned by the host's root.
  # KUBENPU_VM_ICOUNT=N (the benchmark's choice on a shared host): the guest's clock counts
  # instructions, 2^N ns each, instead of the host's time, so a loop's time is the instructions
  # it ran (the agent's wakeups included) and not how busy the host was.
  local icount=()
  [[ -z ${KUBENPU_VM_ICOUNT:-} ]] || icount=(-icount "shift=$KUBENPU_VM_ICOUNT,sleep=on")
  # KUBENPU_VM_NUMA=1: two NUMA nodes of two vCPUs and half the memory each, and the virtio GPU
  # behind a PCI expander bridge on node 1, so its numa_node is 1 (the placement checks). QEMU
  # plugs only bridges into a pxb, hence the pci-bridge between; these devices go last on the command
  # line because QEMU puts a device with no bus on the newest bus.
  local smp=2 gpu=(-device virtio-gpu-pci) numa=()
  if [[ -n ${KUBENPU_VM_NUMA:-} ]]; then
    smp=4 gpu=() numa=(
      -object memory-backend-ram,id=mem0,size=1536M -numa node,nodeid=0,cpus=0-1,memdev=mem0
      -object memory-backend-ram,id=mem1,size=1536M -numa node,nodeid=1,cpus=2-3,memdev=mem1
      -device pxb,id=numa1,bus=pci.0,bus_nr=32,numa_node=1
      -device pci-bridge,id=numa1br,bus=numa1,chassis_nr=1 -device virtio-gpu-pci,bus=numa1br,addr=1)
  fi
  set +o pipefail
  timeout --kill-after=10 "$timeout_s" qemu-system-x86_64 \
    -accel tcg,thread=single "${icount[@]}" -cpu max -m 3G -smp "$smp" -nographic -no-reboot \
    -nic none -kernel "$kernel_dir/vmlinux" -initrd "$kernel_dir/initramfs.cpio" \
    -append "$cmdline" -vga none "${gpu[@]}" -device bochs-display \
    -virtfs "local,path=$vm/root,mount_tag=root,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$repo,mount_tag=src,security_model=none,readonly=on,multidevs=remap" \
    -virtfs "local,path=$out,mount_tag=out,security_model=passthrough,multidevs=remap" \
    "${numa[@]}" \
    </dev/null 2>&1 | stdbuf -o0 tr -d '\r' | tee "$out/console.log"
  qemu_status=${PIPESTATUS[0]}
  set -o pipefail
}

main() {
  (($# >= 2)) || usage
  local kernel=$1 script out extra=()
  script=$(guest_path "$2")
  shift 2
  if (($#)) && [[ $1 != -- ]]; then
    out=$1
    shift
  else
    out=$(mktemp -d /tmp/kubenpu-vm.XXXXXX)
  fi
  if (($#)); then
    [[ $1 == -- ]] || usage
    shift
    extra=("$@")
  fi
  mkdir -p "$out"
  out=$(realpath "$out")
  rm -f "$out"/{rc,harness-error,guest.log,console.log}

  "$here/build.sh" "$kernel"
  local slow
  slow=$(slowness)
  # The ceiling for a guest that never ends scales as the guest's own waits do: at load 22 on
  # 2 cores the 7.3 node scenario's script started 228 s into the boot and the run ran out of a
  # fixed 900 s.
  [[ -n $timeout_s ]] || timeout_s=$(awk -v s="$slow" 'BEGIN { printf "%d\n", 900 * s }')
  # no_timer_check: the kernel's early check that the IO-APIC timer ticks (timer_irq_works)
  # waits a busy loop calibrated moments before; when the loaded host gives TCG's vCPU thread a
  # different share between the calibration and the loop, too few ticks arrive and the boot
  # panics ("IO-APIC + timer doesn't work!", seen at load 20 on 2 cores). Virtual machines skip
  # that check; the guest's timer works either way.
  local cmdline="console=ttyS0 quiet panic=-1 no_timer_check kubenpu.run=$script kubenpu.slow=$slow ${extra[*]}"
  printf 'run.sh: booting %s with %s (out: %s)\n' "$kernel" "$script" "$out" >&2
  boot "$vm/boot/$kernel" "$out" "$cmdline"

  if [[ -s $out/rc ]]; then
    exit "$(<"$out/rc")"
  fi
  ((qemu_status != 124)) ||
    die "the guest timed out after ${timeout_s}s (KUBENPU_VM_TIMEOUT); see $out/console.log" 124
  [[ -e $out/harness-error ]] && die "guest setup failed: $(<"$out/harness-error")" 125
  die "the guest never wrote rc (qemu exit $qemu_status); see $out/console.log" 125
}

main "$@"
