"""What the resolve stage answers for a cgroup: an Attribution, and why it is partial."""

from dataclasses import dataclass
from enum import StrEnum


class Unattributed(StrEnum):
    """Why a cgroup's calls carry empty (or partial) pod labels; the one list of these names."""

    NOT_INDEXED = "not_indexed"  # no cgroup with this id under the cgroup root
    NOT_POD = "not_pod"  # a host process, or a container kubelet did not create
    CONTAINER_NOT_FOUND = "container_not_found"  # in a pod, but no container the runtime knows
    CRI_ERROR = "cri_error"  # the runtime did not answer
    # The runtime's labels break Kubernetes' own length limits (cri.LABEL_LIMITS): a hostile or
    # broken runtime's megabyte of pod name is not made a label of every series.
    LABEL_TOO_LONG = "label_too_long"
    # Not a resolver answer: the agent held calls for a pending lookup, but its table was full.
    PENDING_FULL = "pending_full"


@dataclass(frozen=True)
class Attribution:
    namespace: str = ""
    pod: str = ""
    container: str = ""
    reason: Unattributed | None = None
    # The pod's metadata.uid: the CRI's io.kubernetes.pod.uid label, else the uid in the
    # container's cgroup path. Two pods of the same name, one after the other, differ by it.
    pod_uid: str = ""
