#!/usr/bin/env bash
# `make bench`: the host micro-benchmark, then the guest benchmark in one boot, then the table.
#   bench/run.sh [KERNEL] [OUT_DIR]      (defaults: 6.12, out/bench)
# Writes OUT_DIR/micro.json, OUT_DIR/bench.json (and the guest's logs), OUT_DIR/table.md and
# OUT_DIR/cpu.png (calls/s vs agent CPU), and prints the table. Speed figures only: exactness is asserted by
# tests/test_bench_exactness_vm.py.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
kernel=${1:-6.12}
out=${2:-$repo/out/bench}
py=$repo/.venv/bin/python

mkdir -p "$out"
rm -f "$out"/{micro,bench}.json "$out"/table.md
echo "bench: host micro-benchmark" >&2
"$py" "$repo/bench/micro.py" --json "$out/micro.json" >&2
"$py" "$repo/bench/scrape_stress.py" --json "$out/scrape.json" >&2  # /metrics under load, host-side
"$py" "$repo/bench/stress.py" --json "$out/stress.json" >&2  # idle floods, big trees, push sizes
echo "bench: guest benchmark on $kernel (several minutes under TCG)" >&2
# bpftool for the per-arm checks (bench_guest.py BPFTOOL): the guest root has none.
cp "$(command -v bpftool || echo /usr/sbin/bpftool)" "$out/" 2>/dev/null || echo "bench: no bpftool; arms unchecked" >&2
# The chart's default capabilities, which the GPU jobs row's agents run with (bench_guest.py
# chart_launcher): the flavour a default install gets.
PYTHONPATH="$repo/tests" "$py" -c 'import json, helpers
print(json.dumps(helpers.chart_capabilities("security_file_ioctl", fdinfo=True, jobs=True)))' >"$out/caps.json"
# Longer than run.sh's default: the per-hook rounds start 8 arms afresh in each of 6 rounds, the
# GPU jobs row 4 in each of 3.
KUBENPU_VM_TIMEOUT=${KUBENPU_VM_TIMEOUT:-2700} "$repo/tests/vm/run.sh" "$kernel" /src/bench/bench.sh "$out" >"$out/run.log" 2>&1 || {
  echo "bench: the guest run failed; see $out/run.log and $out/console.log" >&2
  exit 1
}
# The image with and without the BCC fallback (scripts/image.sh prints each size last on stderr).
echo "bench: the image, default and -bcc (buildah; cached)" >&2
for variant in default bcc; do
  "$repo/scripts/image.sh" $([[ $variant == bcc ]] && echo bcc) 2>&1 >/dev/null | tail -n1 |
    sed "s/^image.sh: /$variant: /"
done >"$out/images.txt"
"$py" "$repo/bench/report.py" "$out/bench.json" "$out/micro.json" --plot "$out/cpu.png" \
  --images "$out/images.txt" |
  tee "$out/table.md"
