#!/usr/bin/env bash
# Compile bpf/kubenpu.bpf.c ahead of time into the CO-RE objects the agent loads (one per probe
# mode), and bpf/jobs.bpf.c into the GPU jobs object (docs/jobs.md),
# bpf/guard.bpf.c into the access guard's (docs/guard.md), bpf/placement.bpf.c into the placement
# scheduler's (docs/scheduler.md), with Debian's clang and libbpf headers: `clang -target bpf -g`
# against the minimal bpf/vmlinux.h (docs/core.md). The kernel relocates nothing; libbpf does, at load, from BTF.
#   scripts/bpf.sh [OUTDIR]    default: kubenpu/kernel/objects (in the wheel, and where the
#                              agent looks in a source tree)
# Idempotent: an object newer than every source is kept. CLANG overrides the compiler.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${1:-$repo/kubenpu/kernel/objects}
CLANG=${CLANG:-clang-19}
sources=("$repo"/bpf/*.bpf.c "$repo"/bpf/*.h "$0")

need=()
command -v "$CLANG" >/dev/null || need+=(clang-19)
[[ -e /usr/include/bpf/bpf_helpers.h ]] || need+=(libbpf-dev)
# Into the source tree (make bpf, make test): also bpftool, which tests/test_abi.py reads the
# objects' BTF with. The image's build stage names its own OUTDIR and installs its own compiler.
[[ -z ${1:-} ]] && ! command -v bpftool >/dev/null && need+=(bpftool)
if ((${#need[@]})); then
  . "$here/env.sh"
  host_install "${need[@]}"
fi
mkdir -p "$out"
arch=$(uname -m)
case $arch in x86_64) target=x86 ;; aarch64) target=arm64 ;; *) target=$arch ;; esac
# name source extra-flags: one object per line.
objects=(
  "kubenpu-aggregate kubenpu.bpf.c -DKUBENPU_AGGREGATE"
  "kubenpu-events kubenpu.bpf.c"
  "kubenpu-jobs jobs.bpf.c"
  "kubenpu-guard guard.bpf.c"
  "kubenpu-placement placement.bpf.c"
)
for line in "${objects[@]}"; do
  read -r name source extra <<<"$line"
  obj=$out/$name.bpf.o
  fresh=1
  for src in "${sources[@]}"; do [[ -e $obj && $obj -nt $src ]] || fresh=0; done
  ((fresh)) && continue
  flags=(-target bpf -g -O2 -Wall -Werror "-D__TARGET_ARCH_$target"
    -I"$repo/bpf" -I"/usr/include/$arch-linux-gnu")
  [[ -n $extra ]] && flags+=("$extra")
  "$CLANG" "${flags[@]}" -c "$repo/bpf/$source" -o "$obj.tmp"
  mv "$obj.tmp" "$obj"
  echo "bpf.sh: built $obj" >&2
done
