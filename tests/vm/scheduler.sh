#!/bin/sh
# Guest entry point for the placement scheduler's run (kernel cmdline:
# kubenpu.run=/src/tests/vm/scheduler.sh), on a KUBENPU_VM_NUMA=1 machine.
set -eu
export PYTHONPATH=/src:/src/tests/vm
exec /opt/kubenpu/venv/bin/python /src/tests/vm/scheduler_guest.py /out
