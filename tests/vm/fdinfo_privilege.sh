#!/bin/sh
# Guest entry point for the fdinfo privilege measurement (kernel cmdline:
# kubenpu.run=/src/tests/vm/fdinfo_privilege.sh); the host writes the plan to /out/plan.json.
set -eu
export PYTHONPATH=/src:/src/tests/vm
exec /opt/kubenpu/venv/bin/python /src/tests/vm/fdinfo_privilege_guest.py /out
