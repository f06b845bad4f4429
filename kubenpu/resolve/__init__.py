"""The resolve stage: cgroup id -> cgroup path -> container id -> CRI labels ->
namespace/pod/container, as an Attribution (`kubenpu.resolve.resolver.Resolver`).

This package's own names load no gRPC, so kubenpu.metrics (and kubenpuctl through it) can import
the reasons without the agent's dependencies.
"""

from kubenpu.resolve.result import Attribution, Unattributed

__all__ = ["DEFAULT_ENDPOINT", "Attribution", "Unattributed"]

DEFAULT_ENDPOINT = "unix:///run/containerd/containerd.sock"
