# The KubeNPU node agent. BCC comes from Debian (python3-bpfcc, BCC 0.31 in trixie): it
# compiles the probe at start against the node's kernel headers, mounted read-only from the
# node (/lib/modules, /usr/src) or unpacked from the kheaders module into /tmp.
FROM debian:trixie-slim

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/kubenpu/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-bpfcc \
 && rm -rf /var/lib/apt/lists/*

# The venv sees the system site-packages: that is where Debian puts the bcc module.
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY bpf/ bpf/
COPY kubenpu/ kubenpu/
RUN python3 -m venv --system-site-packages /opt/kubenpu \
 && /opt/kubenpu/bin/pip install --no-cache-dir ".[agent]" \
 && /opt/kubenpu/bin/python -c "import bcc, kubenpu" \
 && rm -rf /src

# The chart's default config: the node's /sys, /dev/dri and /dev/accel under /host.
COPY deploy/kustomize/base/config.yaml /etc/kubenpu/config.yaml

WORKDIR /
# Root, for the one capability the runtime adds (CAP_SYS_ADMIN, see docs/deploy.md); never privileged.
USER 0
EXPOSE 8080
ENTRYPOINT ["kubenpu-agent", "--config", "/etc/kubenpu/config.yaml"]
