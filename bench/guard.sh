#!/bin/sh
# Guest entry point for the access guard's row alone (bench_guest.py --guard); `make bench` runs
# it too. With the guest's clock counting instructions, on a busy host:
#   KUBENPU_VM_ICOUNT=3 tests/vm/run.sh 7.3 /src/bench/guard.sh OUT && .venv/bin/python bench/report.py OUT/bench.json
set -eu
# The CRI test server runs gRPC in this process; drmcall children are forked from it.
export PYTHONPATH=/src GRPC_ENABLE_FORK_SUPPORT=false
exec /opt/kubenpu/venv/bin/python /src/bench/bench_guest.py /out --guard
