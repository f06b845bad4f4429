#!/bin/sh
# Guest entry point for the end-to-end scenario (kernel cmdline: kubenpu.run=/src/tests/vm/e2e.sh).
set -eu
export PYTHONPATH=/src
exec /opt/kubenpu/venv/bin/python /src/tests/vm/e2e_guest.py /out
