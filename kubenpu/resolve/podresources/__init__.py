"""Which pods were given which devices: the kubelet's PodResources v1 API over a unix socket.

`mapping` (standard library only) turns allocated ids into `device` labels; `client` (gRPC) asks
the kubelet. api.proto mirrors k8s.io/kubelet/pkg/apis/podresources/v1 (same names and field
numbers); api_pb2*.py are generated from it by scripts/gen-cri.sh.
"""

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
