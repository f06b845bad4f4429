#!/bin/sh
# Guest entry point for where the per-call time goes (bench_guest.py --where):
#   cp "$(command -v bpftool)" OUT/ && tests/vm/run.sh 6.12 /src/bench/where.sh OUT
set -eu
export PYTHONPATH=/src GRPC_ENABLE_FORK_SUPPORT=false
exec /opt/kubenpu/venv/bin/python /src/bench/bench_guest.py /out --where
