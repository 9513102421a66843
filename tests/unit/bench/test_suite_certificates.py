"""bench/suite_certificates.py: valid certificates where RabbitMQ's client suites read them,
for a run only, and the checkout as it was afterwards."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bench.peer_suites import config_text
from bench.suite_certificates import RENEW_WITHIN, CertificateSet, fresh_certificates
from sluicegate.gateway.config import load_config


def _handshake(certificates: CertificateSet, client: tuple[Path, Path], host: str) -> str:
    """A TLS handshake between Python's ssl stack on both ends, each checking the other's
    certificate against the set's CA; the client certificate's subject as the server saw it."""
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(certificates.server_certificate, certificates.server_key)
    server_context.load_verify_locations(certificates.ca)
    server_context.verify_mode = ssl.CERT_REQUIRED
    client_context = ssl.create_default_context(cafile=str(certificates.ca))
    client_context.load_cert_chain(*client)
    seen: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve() -> None:
            connection, _ = listener.accept()
            with server_context.wrap_socket(connection, server_side=True) as wrapped:
                peer = wrapped.getpeercert()
                assert peer is not None
                seen.append(repr(peer["subject"]))
                wrapped.recv(1)

        thread = threading.Thread(target=serve)
        thread.start()
        with (
            socket.create_connection(listener.getsockname()) as raw,
            client_context.wrap_socket(raw, server_hostname=host) as wrapped,
        ):
            wrapped.sendall(b"x")
        thread.join(timeout=10)
    return seen[0]


def test_the_javascript_suites_tls_gen_result_is_made_for_the_run_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CN", "test-node")
    result = tmp_path / "tls-gen" / "basic" / "result"
    with fresh_certificates(tmp_path, "js") as certificates:
        assert certificates is not None
        assert certificates.client_user == "O=client,CN=test-node"
        client = (
            result / "client_test-node_certificate.pem",
            result / "client_test-node_key.pem",
        )
        for host in ("127.0.0.1", "localhost"):
            assert "test-node" in _handshake(certificates, client, host)
        config = tmp_path / "sluicegate.toml"
        config.write_text(config_text(tmp_path, "js", certificates))
        loaded = load_config(config, environ={})
        assert loaded.tls_ca_file == certificates.ca
        assert loaded.users["O=client,CN=test-node"].password is None
    assert not (tmp_path / "tls-gen").exists()


def _expired_leaves(directory: Path) -> None:
    """A CA that lasts and leaf certificates past their end, as the Python suite's are."""
    directory.mkdir(parents=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old CA")])
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=400))
        .not_valid_after(now + datetime.timedelta(days=400))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca_certificate.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (directory / "ca_key.pem").write_bytes(
        ca_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    for role in ("server", "client"):
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=300))
            .not_valid_after(now - datetime.timedelta(days=1))
            .sign(ca_key, hashes.SHA256())
        )
        pem = leaf.public_bytes(serialization.Encoding.PEM)
        (directory / f"{role}_localhost_certificate.pem").write_bytes(pem)
        (directory / f"{role}_localhost_key.pem").write_bytes(b"old key")


def test_expired_ci_certificates_are_issued_again_by_the_checkouts_ca_then_put_back(
    tmp_path: Path,
) -> None:
    certs = tmp_path / ".ci" / "certs"
    _expired_leaves(certs)
    before = {path.name: path.read_bytes() for path in certs.iterdir()}
    with fresh_certificates(tmp_path, "python") as certificates:
        assert certificates is not None
        # The CA the suite trusts stays the same; the leaves are new and last the run.
        assert certificates.ca.read_bytes() == before["ca_certificate.pem"]
        server = x509.load_pem_x509_certificate(certificates.server_certificate.read_bytes())
        now = datetime.datetime.now(datetime.UTC)
        assert server.not_valid_after_utc > now + RENEW_WITHIN
        client = (certs / "client_localhost_certificate.pem", certs / "client_localhost_key.pem")
        assert "client" in _handshake(certificates, client, "localhost")
    assert {path.name: path.read_bytes() for path in certs.iterdir()} == before


def test_a_checkout_without_certificates_gets_no_tls(tmp_path: Path) -> None:
    with fresh_certificates(tmp_path, "go") as certificates:
        assert certificates is None
    assert list(tmp_path.iterdir()) == []
