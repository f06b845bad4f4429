#!/bin/sh
# Guest entry point for the access guard's run (kernel cmdline: kubenpu.run=/src/tests/vm/guard.sh).
set -eu
export PYTHONPATH=/src:/src/tests/vm
exec /opt/kubenpu/venv/bin/python /src/tests/vm/guard_guest.py /out
