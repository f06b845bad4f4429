"""virtio-gpu (include/uapi/drm/virtgpu_drm.h)."""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="virtio_gpu",
    drivers=("virtio_gpu",),
    header="drm/virtgpu_drm.h",
    ioctls=(
        # TRANSFER_TO_HOST / TRANSFER_FROM_HOST (0x47 / 0x46) are not counted: they copy buffer
        # contents, like pread/pwrite on other drivers.
        Ioctl(0x42, Kind.SUBMIT, "DRM_IOCTL_VIRTGPU_EXECBUFFER"),
        Ioctl(0x44, Kind.ALLOC, "DRM_IOCTL_VIRTGPU_RESOURCE_CREATE"),
        Ioctl(0x48, Kind.WAIT, "DRM_IOCTL_VIRTGPU_WAIT"),
        Ioctl(0x4A, Kind.ALLOC, "DRM_IOCTL_VIRTGPU_RESOURCE_CREATE_BLOB"),
    ),
)
