"""Qualcomm Adreno, msm (include/uapi/drm/msm_drm.h).

The DRM device hangs off the display controller (msm_dpu, msm_mdp, mdp4) or, for a headless GPU,
off the GPU itself (adreno; "msm" on older kernels).
"""

from kubenpu.vendors import Ioctl, Kind, Vendor

VENDOR = Vendor(
    name="msm",
    drivers=("msm_dpu", "msm_mdp", "mdp4", "adreno", "msm"),
    header="drm/msm_drm.h",
    ioctls=(
        # VM_BIND (0x4D) is not counted: it only maps existing buffers into a VM.
        Ioctl(0x42, Kind.ALLOC, "DRM_IOCTL_MSM_GEM_NEW"),
        Ioctl(0x44, Kind.WAIT, "DRM_IOCTL_MSM_GEM_CPU_PREP"),
        Ioctl(0x46, Kind.SUBMIT, "DRM_IOCTL_MSM_GEM_SUBMIT"),
        Ioctl(0x47, Kind.WAIT, "DRM_IOCTL_MSM_WAIT_FENCE"),
    ),
)
