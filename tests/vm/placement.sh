#!/bin/sh
# Guest entry point for the placement checks (tests/test_placement_vm.py), on the two-node
# machine: KUBENPU_VM_NUMA=1 tests/vm/run.sh KERNEL /src/tests/vm/placement.sh OUT
set -eu
export PYTHONPATH=/src:/src/tests/vm
exec /opt/kubenpu/venv/bin/python /src/tests/vm/placement_guest.py /out
