#!/bin/sh
# Guest entry point for the pod-churn scenarios (kernel cmdline: kubenpu.run=/src/tests/vm/churn.sh).
set -eu
export PYTHONPATH=/src:/src/tests/vm
exec /opt/kubenpu/venv/bin/python /src/tests/vm/churn_guest.py /out
