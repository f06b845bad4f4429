"""The result of attribution, shared by the resolver and the CRI client."""

from dataclasses import dataclass

# Reasons for partial attribution (names kept from the Go agent, plus cri_error).
NOT_INDEXED = "not_indexed"  # no cgroup with this id under the cgroup root
NOT_POD = "not_pod"  # a host process, or a container kubelet did not create
CONTAINER_NOT_FOUND = "container_not_found"  # in a pod, but no container the runtime knows
CRI_ERROR = "cri_error"  # the runtime did not answer; retried after a back-off


@dataclass(frozen=True)
class Attribution:
    namespace: str = ""
    pod: str = ""
    container: str = ""
    reason: str | None = None
