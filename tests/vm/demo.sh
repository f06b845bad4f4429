#!/bin/sh
# Guest entry point for `make demo`: sample pods use the devices while the agent runs, then
# `kubenpuctl devices`, `kubenpuctl top --once` and the key series (tests/vm/demo_guest.py).
set -eu
export PYTHONPATH=/src
/opt/kubenpu/venv/bin/python /src/tests/vm/demo_guest.py /out >/out/demo.log 2>&1 || {
  cat /out/demo.log; echo "== agent log =="; cat /out/agent.log 2>/dev/null; exit 1; }
echo "== agent log (startup) =="
head -n 20 /out/agent.log
cat /out/demo.log
