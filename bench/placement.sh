#!/bin/sh
# Guest entry point for the placement count's per-call cost (bench/placement_guest.py), on the
# two-node machine with the guest's clock counting instructions; OUT holds the object built
# before the count (bench/placement-before.sh) as kubenpu-aggregate-before.bpf.o:
#   bench/placement-before.sh OUT && KUBENPU_VM_NUMA=1 KUBENPU_VM_ICOUNT=3 \
#     KUBENPU_VM_TIMEOUT=3600 tests/vm/run.sh 7.3 /src/bench/placement.sh OUT
set -eu
export PYTHONPATH=/src:/src/tests/vm
exec /opt/kubenpu/venv/bin/python /src/bench/placement_guest.py /out
