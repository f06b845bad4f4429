# The KubeNPU node agent. The kernel side is the CO-RE object compiled here, in the first stage,
# from bpf/kubenpu.bpf.c (Debian's clang and libbpf headers); at start the system libbpf relocates
# it against the node's BTF, so the node needs no kernel headers and the image no LLVM.
#   docker build -t kubenpu-agent:<tag> .                          the default: CO-RE only
#   docker build --build-arg BCC=true -t kubenpu-agent:<tag>-bcc .  adds the BCC fallback
# The -bcc variant adds Debian's python3-bpfcc (BCC 0.31 and LLVM), which compiles the same
# source on the node against its headers (chart value bccFallback: true mounts them).
FROM debian:trixie-slim AS bpf
RUN apt-get update \
 && apt-get install -y --no-install-recommends clang-19 libbpf-dev libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY bpf/ /src/bpf/
COPY scripts/bpf.sh /src/scripts/
RUN CLANG=clang-19 /src/scripts/bpf.sh /objects

FROM debian:trixie-slim
ARG BCC=false

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/kubenpu/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv libbpf1 \
    $(if [ "$BCC" = true ]; then echo python3-bpfcc; fi) \
 && rm -rf /var/lib/apt/lists/*

# The venv sees the system site-packages: that is where Debian puts the bcc module.
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY bpf/ bpf/
COPY kubenpu/ kubenpu/
COPY --from=bpf /objects/ kubenpu/kernel/objects/
RUN python3 -m venv --system-site-packages /opt/kubenpu \
 && /opt/kubenpu/bin/pip install --no-cache-dir ".[agent]" \
 && /opt/kubenpu/bin/python -c "import kubenpu.kernel.core as c; assert c.object_path(True).exists()" \
 && if [ "$BCC" = true ]; then /opt/kubenpu/bin/python -c "import bcc"; fi \
 && rm -rf /src

# The chart's default config: the node's /sys, /dev/dri and /dev/accel under /host.
COPY deploy/kustomize/base/config.yaml /etc/kubenpu/config.yaml

WORKDIR /
# Root, for the capabilities the runtime adds (CAP_BPF + CAP_PERFMON, see docs/deploy.md); never
# privileged.
USER 0
EXPOSE 8080
ENTRYPOINT ["kubenpu-agent", "--config", "/etc/kubenpu/config.yaml"]
