"""TLS certificate validity at --check-config and at start (kubenpu.export.certs).

The certificates are real X.509 files made here with the `cryptography` package; the start is
the real export.start, whose metrics server loads them with Python's ssl module.
"""

from __future__ import annotations

import datetime
import logging
from pathlib import Path

import pytest
from helpers import certificate, make_config, start_telemetry, values

from kubenpu import agent
from kubenpu.export import certs
from kubenpu.metrics.catalogue import TLS_EXPIRY

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


CASES = {
    "expired": (NOW - 10 * DAY, NOW - DAY, "expired on"),
    "not-yet-valid": (NOW + DAY, NOW + 10 * DAY, "is not valid before"),
}


def tls_yaml(cert: Path, key: Path, ca: Path | None = None) -> str:
    otlp = f"  otlp: {{enabled: true, certificate: {ca}}}\n" if ca else ""
    return f"export:\n  prometheus: {{tls: {{cert_file: {cert}, key_file: {key}}}}}\n{otlp}"


@pytest.mark.parametrize("case", CASES)
def test_check_config_warns_of_a_certificate_outside_its_validity(
    tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An expired or not-yet-valid certificate passed --check-config and started silently."""
    before, after, words = CASES[case]
    cert, key = certificate(tmp_path, case, before, after)
    ca, _ = certificate(tmp_path, "ca", NOW - DAY, NOW + DAY)
    path = tmp_path / "config.yaml"
    path.write_text(tls_yaml(cert, key, ca))
    assert agent.main(["--check-config", str(path)]) == 0  # a warning, not an error
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("warning: export.prometheus.tls.cert_file: certificate 'CN=")
    assert words in err[0]


def test_a_valid_certificate_gives_no_warning(tmp_path: Path, capsys) -> None:
    cert, key = certificate(tmp_path, "ok", NOW - DAY, NOW + DAY)
    path = tmp_path / "config.yaml"
    path.write_text(tls_yaml(cert, key))
    assert agent.main(["--check-config", str(path)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("case", CASES)
def test_start_warns_and_exports_the_expiry(tmp_path: Path, case: str, caplog) -> None:
    before, after, words = CASES[case]
    cert, key = certificate(tmp_path, case, before, after)
    cfg = make_config(tmp_path, tls_yaml(cert, key))
    with caplog.at_level(logging.WARNING, logger="kubenpu.export.certs"):
        tel = start_telemetry(cfg)  # it starts: a scraper may not check the certificate
    try:
        [warning] = [r.getMessage() for r in caplog.records if r.name == "kubenpu.export.certs"]
        assert words in warning
        assert values(tel.metrics, TLS_EXPIRY) == {
            ("export.prometheus.tls.cert_file",): int(after.timestamp())
        }
    finally:
        tel.shutdown()


def test_the_earliest_expiry_of_a_bundle_is_exported(tmp_path: Path) -> None:
    first, _ = certificate(tmp_path, "a", NOW - DAY, NOW + 2 * DAY)
    second, _ = certificate(tmp_path, "b", NOW - DAY, NOW + DAY)
    bundle = first.read_bytes() + second.read_bytes()
    found = certs.validity("export.otlp.certificate", bundle, NOW)
    assert found is not None and found.problems == ()
    assert found.not_after == int((NOW + DAY).timestamp())
    assert certs.validity("export.otlp.certificate", b"not a certificate", NOW) is None
