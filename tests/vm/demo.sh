#!/bin/sh
# Guest entry point for `make demo`: run the sample pods, then show what the agent exported.
set -eu
export PYTHONPATH=/src
/opt/kubenpu/venv/bin/python /src/tests/vm/e2e_guest.py /out aggregate >/out/scenario.log 2>&1 || {
  cat /out/scenario.log; exit 1; }
echo "== agent log (startup) =="
head -n 20 /out/aggregate/agent.log
echo "== kubenpu_ series on /metrics =="
grep '^kubenpu_' /out/aggregate/metrics.txt
