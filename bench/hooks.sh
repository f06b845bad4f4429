#!/bin/sh
# Guest entry point for the per-call rounds, the per-source rows and idle with 1,000 pods alone
# (bench_guest.py --hooks); on a busy host, with the guest's clock counting instructions:
#   cp "$(command -v bpftool)" OUT/ && KUBENPU_VM_ICOUNT=3 KUBENPU_VM_TIMEOUT=3600 \
#     tests/vm/run.sh 6.12 /src/bench/hooks.sh OUT && .venv/bin/python bench/report.py OUT/bench.json
# A script of your own in OUT (run as /out/NAME) can set KUBENPU_BENCH_ROUNDS_ONLY=1 (the per-call
# rounds alone) and KUBENPU_BENCH_ARMS (their arms, comma-separated) before the same exec.
# KUBENPU_BENCH_START_IDLE=1 (in the guest's environment, e.g. a copy of this script in OUT):
# only the default agent's and the one-liner's start and idle, and idle with 1,000 pods.
set -eu
# The CRI test server runs gRPC in this process; drmcall children are forked from it.
export PYTHONPATH=/src GRPC_ENABLE_FORK_SUPPORT=false
exec /opt/kubenpu/venv/bin/python /src/bench/bench_guest.py /out --hooks \
    ${KUBENPU_BENCH_START_IDLE:+--start-idle} ${HOOK_ROUNDS:+--rounds "$HOOK_ROUNDS"}
