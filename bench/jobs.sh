#!/bin/sh
# Guest entry point for the GPU jobs row alone (bench_guest.py --jobs); `make bench` runs it too:
#   tests/vm/run.sh 6.12 /src/bench/jobs.sh OUT && .venv/bin/python bench/report.py OUT/bench.json
# KUBENPU_BENCH_JOB_ARMS (comma-separated, in the guest's environment, e.g. a copy of this script
# in OUT) picks its arms: none, agent, "agent jobs off", bpftrace.
set -eu
# The CRI test server runs gRPC in this process; drmcall children are forked from it.
export PYTHONPATH=/src GRPC_ENABLE_FORK_SUPPORT=false
exec /opt/kubenpu/venv/bin/python /src/bench/bench_guest.py /out --jobs
