#!/bin/sh
# Guest entry point for the agent in its own image (kernel cmdline: kubenpu.run=/src/tests/vm/image.sh).
set -eu
export PYTHONPATH=/src
exec /opt/kubenpu/venv/bin/python /src/tests/vm/image_guest.py /out
