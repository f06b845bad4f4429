# The KubeNPU node agent. The kernel side is the CO-RE object compiled here, in the first stage,
# from bpf/kubenpu.bpf.c (Debian's clang and libbpf headers); at start the system libbpf relocates
# it against the node's BTF, so the node needs no kernel headers and the image no LLVM.
#   docker build -t kubenpu-agent:<tag> .                          the default: CO-RE only
#   docker build --build-arg BCC=true -t kubenpu-agent:<tag>-bcc .  adds the BCC fallback
# The -bcc variant adds Debian's python3-bpfcc (BCC 0.31 and LLVM), which compiles the same
# source on the node against its headers (chart value bccFallback: true mounts them).
# Three stages: the objects, the venv (with pip, which stays there), the image (Python, libbpf and
# the venv only). docs/performance.md ("Image size") has what each part weighs.
FROM debian:trixie-slim AS bpf
RUN apt-get update \
 && apt-get install -y --no-install-recommends clang-19 libbpf-dev libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY bpf/ /src/bpf/
COPY scripts/bpf.sh /src/scripts/
RUN CLANG=clang-19 /src/scripts/bpf.sh /objects

# The venv, built where pip and python3-venv are, then copied alone into the image: same base,
# same python3, same path, so its interpreter links and scripts' shebangs hold there.
FROM debian:trixie-slim AS venv
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY bpf/ bpf/
COPY kubenpu/ kubenpu/
COPY --from=bpf /objects/ kubenpu/kernel/objects/
# The venv sees the system site-packages: that is where Debian puts the bcc module. Bytecode only
# for kubenpu and what an agent's start imports (OTLP and the certificate check included): the
# root file system is read-only, so anything else compiles in memory, once, if ever imported.
# Extension modules lose their debug info and symbols (PyYAML's alone shipped 2.4 MB of DWARF).
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils \
 && python3 -m venv --system-site-packages /opt/kubenpu \
 && /opt/kubenpu/bin/pip install --no-cache-dir --no-compile ".[agent]" \
 && /opt/kubenpu/bin/pip uninstall --yes pip \
 && /opt/kubenpu/bin/python -m compileall -q /opt/kubenpu/lib/python3*/site-packages/kubenpu \
 && /opt/kubenpu/bin/python -c "import kubenpu.agent, kubenpu.export.otlp, grpc._channel, \
    prometheus_client, opentelemetry.sdk.metrics, cryptography.x509, requests, \
    opentelemetry.exporter.otlp.proto.grpc.metric_exporter, \
    opentelemetry.exporter.otlp.proto.http.metric_exporter" \
 && find /opt/kubenpu -name '*.so' -exec strip --strip-unneeded {} +

FROM debian:trixie-slim
ARG BCC=false

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/kubenpu/bin:$PATH

# ca-certificates: the system trust store (ssl's default context), which python3-venv used to
# bring in; python3-venv itself (ensurepip, the pip and setuptools wheels) stays in the venv stage.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libbpf1 ca-certificates \
    $(if [ "$BCC" = true ]; then echo python3-bpfcc; fi) \
 && rm -rf /var/lib/apt/lists/*

COPY --from=venv /opt/kubenpu/ /opt/kubenpu/
# The copied venv runs on this stage's python3 (the BCC variant's check needs python3-bpfcc here).
RUN python -c "import kubenpu.kernel.core as c; assert c.object_path(True).exists()" \
 && if [ "$BCC" = true ]; then python -c "import bcc"; fi

# The chart's default config: the node's /sys, /dev/dri and /dev/accel under /host.
COPY deploy/kustomize/base/config.yaml /etc/kubenpu/config.yaml

WORKDIR /
# Root, for the capabilities the runtime adds (CAP_BPF + CAP_PERFMON, see docs/deploy.md); never
# privileged.
USER 0
EXPOSE 8080
ENTRYPOINT ["kubenpu-agent", "--config", "/etc/kubenpu/config.yaml"]
