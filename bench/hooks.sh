#!/bin/sh
# Guest entry point for the per-hook ioctl cost alone (bench_guest.py --hooks):
#   KUBENPU_VM_TIMEOUT=1800 tests/vm/run.sh 6.12 /src/bench/hooks.sh OUT && .venv/bin/python bench/report.py OUT/bench.json
set -eu
# The CRI test server runs gRPC in this process; drmcall children are forked from it.
export PYTHONPATH=/src GRPC_ENABLE_FORK_SUPPORT=false
exec /opt/kubenpu/venv/bin/python /src/bench/bench_guest.py /out --hooks
