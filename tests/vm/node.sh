#!/bin/sh
# Guest entry point for the real-containerd scenario (kernel cmdline: kubenpu.run=/src/tests/vm/node.sh).
set -eu
export PYTHONPATH=/src
exec /opt/kubenpu/venv/bin/python /src/tests/vm/node_guest.py /out
