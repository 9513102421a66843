"""Fresh TLS certificates for RabbitMQ's client suites, made with ``cryptography`` at run time.

The suites read certificates from fixed paths their CI fills with rabbitmq/tls-gen: the Go and
Python suites from their checkout's ``.ci/certs`` (committed, and the Python suite's server and
client certificates expired on 2026-03-31), the JavaScript suite from
``tls-gen/basic/result`` (made by its CI, absent from a checkout). :func:`fresh_certificates`
puts valid ones there for the length of a run, as tls-gen names them, and then puts back what
was there: the checkout is left as it was found.

- ``.ci/certs``: the server and client ``localhost`` certificates are issued again, signed by
  the checkout's own CA when its key is there and the CA is valid (so the CA file the suite
  trusts stays the same), by a new CA otherwise; only certificates that are missing or expire
  within :data:`RENEW_WITHIN` are replaced.
- ``tls-gen/basic/result``: a CA, ``server_CN`` and ``client_CN`` certificates and keys, ``CN``
  from the environment as tls-gen's Makefile takes it (the suite's default is ``rabbitmq``).

Every server certificate names ``localhost`` and ``127.0.0.1``, which the suites dial; client
certificates have the subject ``O=client,CN=...`` that RabbitMQ's EXTERNAL mechanism logs in as.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# A certificate that expires sooner than this is issued again: a run takes at most an hour.
RENEW_WITHIN: Final = datetime.timedelta(days=1)
# How long what is made here lasts: only for the run, but a clock off by hours must not matter.
LIFETIME: Final = datetime.timedelta(days=7)
# The subject name the JavaScript suite's client certificate has without a CN in the environment.
JS_DEFAULT_CN: Final = "rabbitmq"
JS_DIRECTORY: Final = Path("tls-gen/basic/result")
CI_DIRECTORY: Final = Path(".ci/certs")


@dataclass(frozen=True)
class CertificateSet:
    """Where a run's server finds its certificate, key and clients' CA, and the user its
    client certificate logs in as (RabbitMQ's form of the subject)."""

    ca: Path
    server_certificate: Path
    server_key: Path
    client_user: str


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + LIFETIME)
    )


@dataclass(frozen=True)
class _Authority:
    certificate: x509.Certificate
    key: CertificateIssuerPrivateKeyTypes


def _new_authority() -> tuple[_Authority, bytes]:
    """A self-signed CA, and its key in PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name("sluicegate peer-suite CA")
    certificate = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return _Authority(certificate, key), _key_pem(key)


def _issue(
    authority: _Authority, subject: x509.Name, *, server: bool
) -> tuple[x509.Certificate, bytes]:
    """A leaf certificate for ``subject`` signed by ``authority``, and its key in PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    if server:
        names.append(x509.IPAddress(IPv4Address("127.0.0.1")))
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    certificate = (
        _builder(subject, authority.certificate.subject, key)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(authority.key, hashes.SHA256())
    )
    return certificate, _key_pem(key)


def _lasts(path: Path) -> bool:
    """Whether the PEM certificate at ``path`` exists and stays valid through a run."""
    if not path.is_file():
        return False
    try:
        certificate = x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError:
        return False
    return certificate.not_valid_after_utc > _now() + RENEW_WITHIN


def _existing_authority(directory: Path) -> _Authority | None:
    """The checkout's CA if it lasts and its key is there and usable."""
    certificate_path, key_path = directory / "ca_certificate.pem", directory / "ca_key.pem"
    if not _lasts(certificate_path) or not key_path.is_file():
        return None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        return None
    return _Authority(x509.load_pem_x509_certificate(certificate_path.read_bytes()), key)


class _Files:
    """Files written for a run, and what each held before (None: it did not exist)."""

    def __init__(self) -> None:
        self.before: dict[Path, bytes | None] = {}
        # Directories made for them, deepest last.
        self.made: list[Path] = []

    def write(self, path: Path, data: bytes) -> None:
        if path not in self.before:
            self.before[path] = path.read_bytes() if path.is_file() else None
        missing = [parent for parent in path.parents if not parent.exists()]
        self.made += reversed(missing)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def restore(self) -> None:
        for path, data in self.before.items():
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(data)
        for directory in reversed(self.made):
            directory.rmdir()


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _ci_set(directory: Path, files: _Files) -> CertificateSet | None:
    """Renew the ``localhost`` certificates of a checkout's ``.ci/certs``, if it has them."""
    ca = directory / "ca_certificate.pem"
    server, server_key = (
        directory / "server_localhost_certificate.pem",
        directory / "server_localhost_key.pem",
    )
    client, client_key = (
        directory / "client_localhost_certificate.pem",
        directory / "client_localhost_key.pem",
    )
    if not directory.is_dir():
        return None
    if not (_lasts(ca) and _lasts(server) and _lasts(client)):
        authority = _existing_authority(directory)
        if authority is None:
            authority, key = _new_authority()
            files.write(ca, _pem(authority.certificate))
            files.write(directory / "ca_key.pem", key)
        for path, key_path, organization, is_server in (
            (server, server_key, "server", True),
            (client, client_key, "client", False),
        ):
            certificate, key = _issue(authority, _name("localhost", organization), server=is_server)
            files.write(path, _pem(certificate))
            files.write(key_path, key)
    return CertificateSet(ca, server, server_key, "O=client,CN=localhost")


def _js_set(directory: Path, files: _Files, common_name: str) -> CertificateSet:
    """tls-gen's ``basic`` result for ``common_name``, made anew unless it lasts."""
    ca = directory / "ca_certificate.pem"
    server = directory / f"server_{common_name}_certificate.pem"
    server_key = directory / f"server_{common_name}_key.pem"
    client = directory / f"client_{common_name}_certificate.pem"
    client_key = directory / f"client_{common_name}_key.pem"
    if not (_lasts(ca) and _lasts(server) and _lasts(client)):
        authority, key = _new_authority()
        files.write(ca, _pem(authority.certificate))
        files.write(directory / "ca_key.pem", key)
        for path, key_path, organization, is_server in (
            (server, server_key, "server", True),
            (client, client_key, "client", False),
        ):
            subject = _name(common_name, organization)
            certificate, leaf_key = _issue(authority, subject, server=is_server)
            files.write(path, _pem(certificate))
            files.write(key_path, leaf_key)
    return CertificateSet(ca, server, server_key, f"O=client,CN={common_name}")


@contextmanager
def fresh_certificates(suite: Path, kind: str) -> Iterator[CertificateSet | None]:
    """Valid certificates where the suite reads them, for the length of the ``with``; None
    when the suite has none to read (a Go or Python checkout without ``.ci/certs``)."""
    files = _Files()
    try:
        if kind == "js":
            common_name = os.environ.get("CN", JS_DEFAULT_CN)
            yield _js_set(suite / JS_DIRECTORY, files, common_name)
        else:
            yield _ci_set(suite / CI_DIRECTORY, files)
    finally:
        files.restore()
