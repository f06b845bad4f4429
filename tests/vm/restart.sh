#!/bin/sh
# Guest entry point for the restart runs (kernel cmdline: kubenpu.run=/src/tests/vm/restart.sh).
set -eu
export PYTHONPATH=/src:/src/tests/vm
exec /opt/kubenpu/venv/bin/python /src/tests/vm/restart_guest.py /out
