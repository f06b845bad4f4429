"""Write a one-layer OCI image archive from local files, for `ctr images import` (nothing pulled).

    write_archive(out, "docker.io/kubenpu/pause:test", {"bin/busybox": Path(...)},
                  {"bin/sleep": "busybox"}, cmd=["/bin/sleep", "2147483647"])

The archive is an OCI image layout in a tar (oci-layout, index.json, blobs/sha256/...) with an
uncompressed layer, so the layer digest is also its diff id. The index names the image with
containerd's io.containerd.image.name annotation, which `ctr images import` uses as the image name.
Entries have fixed owners and times: the same inputs give the same image id.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
PLATFORM = {"architecture": "amd64", "os": "linux"}
# What runc and a shell expect to find; /etc/passwd and /etc/group let the runtime resolve root.
DIRS = {"bin": 0o755, "dev": 0o755, "etc": 0o755, "proc": 0o555, "sys": 0o555, "tmp": 0o1777}
ETC = {"etc/passwd": b"root:x:0:0:root:/:/bin/sh\n", "etc/group": b"root:x:0:\n"}


def _info(name: str, kind: bytes, mode: int, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size = kind, mode, size
    return info


def layer(files: dict[str, Path], links: dict[str, str]) -> bytes:
    """A tar of DIRS, ETC, `files` (image path -> host file) and `links` (path -> target)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = dict(DIRS)
        for path in [*files, *links]:
            parent = Path(path).parent
            while str(parent) != ".":
                dirs.setdefault(str(parent), 0o755)
                parent = parent.parent
        for name, mode in sorted(dirs.items()):
            tar.addfile(_info(name, tarfile.DIRTYPE, mode))
        for name, data in ETC.items():
            tar.addfile(_info(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
        for name, src in sorted(files.items()):
            data = src.read_bytes()
            tar.addfile(_info(name, tarfile.REGTYPE, 0o755, len(data)), io.BytesIO(data))
        for name, target in sorted(links.items()):
            link = _info(name, tarfile.SYMTYPE, 0o777)
            link.linkname = target
            tar.addfile(link)
    return buf.getvalue()


def _descriptor(media_type: str, blob: bytes) -> dict:
    return {"mediaType": media_type, "digest": _digest(blob), "size": len(blob)}


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def _json(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_archive(
    out: Path, name: str, files: dict[str, Path], links: dict[str, str], cmd: list[str]
) -> str:
    """Write the image archive to `out`; returns the image's config digest (its id)."""
    tar_layer = layer(files, links)
    config = _json(
        {
            **PLATFORM,
            "config": {"Cmd": cmd, "Env": ["PATH=/usr/local/bin:/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [_digest(tar_layer)]},
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": _descriptor(OCI_CONFIG, config),
            "layers": [_descriptor(OCI_LAYER, tar_layer)],
        }
    )
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                **_descriptor(OCI_MANIFEST, manifest),
                "platform": PLATFORM,
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rpartition(":")[2],
                },
            }
        ],
    }
    with tarfile.open(out, "w") as tar:
        entries = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index)}
        entries |= {f"blobs/sha256/{_digest(b)[7:]}": b for b in (tar_layer, config, manifest)}
        for path, blob in entries.items():
            tar.addfile(_info(path, tarfile.REGTYPE, 0o644, len(blob)), io.BytesIO(blob))
    return _digest(config)
