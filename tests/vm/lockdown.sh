#!/bin/sh
# Guest entry point for the e2e under lockdown=confidentiality (kubenpu.run=/src/tests/vm/lockdown.sh
# with the kernel argument): the scenario, then the kprobe attach that lockdown must refuse.
set -eu
export PYTHONPATH=/src:/src/tests/vm
/opt/kubenpu/venv/bin/python /src/tests/vm/e2e_guest.py /out
exec /opt/kubenpu/venv/bin/python /src/tests/vm/lockdown_guest.py /out/kprobe
