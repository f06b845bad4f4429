"""KubeNPU: per-pod counts of GPU/NPU driver calls, exported over OpenTelemetry."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kubenpu")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+src"
