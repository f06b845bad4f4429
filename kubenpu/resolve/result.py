"""What the resolve stage answers for a cgroup: an Attribution, and why it is partial."""

from dataclasses import dataclass

from kubenpu.metrics.catalogue import Unattributed


@dataclass(frozen=True)
class Attribution:
    namespace: str = ""
    pod: str = ""
    container: str = ""
    reason: Unattributed | None = None
    # The pod's metadata.uid: the CRI's io.kubernetes.pod.uid label, else the uid in the
    # container's cgroup path. Two pods of the same name, one after the other, differ by it.
    pod_uid: str = ""
