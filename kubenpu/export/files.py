"""The exporters' secrets and TLS files: which settings name one, and how each is read. The
start reads them once; --check-config reads them the same way, so both report the same lines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kubenpu import files
from kubenpu.export.errors import ExportError

if TYPE_CHECKING:
    from kubenpu.config import Config

MAX_FILE = 1 << 20  # a PEM chain is a few KiB
MAX_SECRET = 4096  # a password or token; longer is an error, not cut short


@dataclass(frozen=True)
class File:
    setting: str  # the config key, e.g. export.prometheus.auth.password_file
    path: str
    secret: bool  # read with read_secret: at most MAX_SECRET bytes, not blank


def configured(cfg: Config) -> list[File]:
    """Every file the exporters will read at start, as configured (unset ones left out)."""
    prom, otlp = cfg.export.prometheus, cfg.export.otlp
    found = [
        File("export.prometheus.tls.cert_file", prom.tls.cert_file, False),
        File("export.prometheus.tls.key_file", prom.tls.key_file, False),
        File("export.prometheus.auth.password_file", prom.auth.password_file, True),
        File("export.prometheus.auth.bearer_token_file", prom.auth.bearer_token_file, True),
    ]
    if otlp.enabled:
        found += [
            File("export.otlp.certificate", otlp.certificate, False),
            File("export.otlp.client_certificate", otlp.client_certificate, False),
            File("export.otlp.client_key", otlp.client_key, False),
        ]
    return [f for f in found if f.path]


def read_regular(path: str, what: str, limit: int = MAX_FILE) -> bytes:
    """The file's bytes. ExportError unless it is a regular file of at most `limit` bytes: a
    directory cannot be read, a FIFO or a device would block the start, or never end."""
    try:
        data = files.read_regular(path, limit + 1)
    except OSError as err:
        raise ExportError(f"cannot read {what} {path}: {err.strerror or err}") from None
    if len(data) > limit:
        raise ExportError(f"{what} {path} is larger than {limit} bytes")
    return data


def read_secret(path: str, what: str) -> bytes:
    secret = read_regular(path, what, MAX_SECRET).strip()
    if not secret:
        raise ExportError(f"{what} {path} is empty")
    return secret


def problems(cfg: Config) -> list[str]:
    """One line per configured file that the start could not read."""
    found = []
    for f in configured(cfg):
        try:
            (read_secret if f.secret else read_regular)(f.path, f.setting)
        except ExportError as err:
            found.append(str(err))
    return found
