#!/usr/bin/env bash
# Compile bpf/kubenpu.bpf.c ahead of time into the CO-RE objects the agent loads (one per probe
# mode), with Debian's clang and libbpf headers: `clang -target bpf -g` against the minimal
# bpf/vmlinux.h (docs/core.md). The kernel relocates nothing; libbpf does, at load, from BTF.
#   scripts/bpf.sh [OUTDIR]    default: kubenpu/kernel/objects (in the wheel, and where the
#                              agent looks in a source tree)
# Idempotent: an object newer than every source is kept. CLANG overrides the compiler.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
out=${1:-$repo/kubenpu/kernel/objects}
CLANG=${CLANG:-clang-19}
sources=("$repo"/bpf/kubenpu.bpf.c "$repo"/bpf/*.h "$0")

if ! command -v "$CLANG" >/dev/null || ! command -v bpftool >/dev/null || [[ ! -e /usr/include/bpf/bpf_helpers.h ]]; then
  . "$here/env.sh"
  host_install clang-19 libbpf-dev bpftool
fi
mkdir -p "$out"
arch=$(uname -m)
case $arch in x86_64) target=x86 ;; aarch64) target=arm64 ;; *) target=$arch ;; esac
for mode in aggregate events; do
  obj=$out/kubenpu-$mode.bpf.o
  fresh=1
  for src in "${sources[@]}"; do [[ -e $obj && $obj -nt $src ]] || fresh=0; done
  ((fresh)) && continue
  flags=(-target bpf -g -O2 -Wall -Werror "-D__TARGET_ARCH_$target"
    -I"$repo/bpf" -I"/usr/include/$arch-linux-gnu")
  [[ $mode == aggregate ]] && flags+=(-DKUBENPU_AGGREGATE)
  "$CLANG" "${flags[@]}" -c "$repo/bpf/kubenpu.bpf.c" -o "$obj.tmp"
  mv "$obj.tmp" "$obj"
  echo "bpf.sh: built $obj" >&2
done
