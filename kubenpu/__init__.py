"""KubeNPU: per-pod counts of GPU/NPU driver calls, exported over OpenTelemetry."""

# pyproject.toml's version, written here too (tests/test_agent.py checks they agree): importing
# importlib.metadata and scanning the installed packages took 0.7 s of a start under TCG.
__version__ = "0.1.0"
