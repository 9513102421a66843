"""Self-signed TLS certificates for tests, made with the openssl binary."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest


def self_signed(
    directory: Path, name: str, alt_names: str, subject: str | None = None
) -> tuple[Path, Path]:
    """``(certificate, key)`` for ``CN=name`` (or ``subject``, openssl's ``/CN=a/O=b`` form) with
    ``alt_names`` (``DNS:x,IP:y``), one day long.

    Skips the test where the openssl binary is missing.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("the openssl binary is needed to make a test certificate")
    cert, key = directory / f"{name}-cert.pem", directory / f"{name}-key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            subject or f"/CN={name}",
            "-addext",
            f"subjectAltName={alt_names}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key
