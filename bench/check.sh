#!/bin/sh
# Guest entry point for tests/test_bench_exactness_vm.py: only the max-rate exactness bursts.
set -eu
# The CRI test server runs gRPC in this process; drmcall children are forked from it.
export PYTHONPATH=/src GRPC_ENABLE_FORK_SUPPORT=false
exec /opt/kubenpu/venv/bin/python /src/bench/bench_guest.py /out --check
