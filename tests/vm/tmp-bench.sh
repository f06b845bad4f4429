#!/bin/bash
t() { local s=$(cut -d' ' -f1 /proc/uptime); "$@"; echo "$* : $(echo "$(cut -d' ' -f1 /proc/uptime) - $s" | bc 2>/dev/null || true) $s $(cut -d' ' -f1 /proc/uptime)"; }
t bash -c 'for i in $(seq 20); do /bin/true; done'
t bash -c 'for i in $(seq 20); do /usr/bin/mountpoint -q /tmp; done'
cp /bin/true /tmp/true
t bash -c 'for i in $(seq 20); do /tmp/true; done'
cat /proc/mounts
grep -c . /proc/cpuinfo; grep -m1 'model name' /proc/cpuinfo
