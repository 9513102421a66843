"""The TLS context of the amqps:// listener, from the certificate and key in the config, and
the name a client certificate logs in as with SASL EXTERNAL."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Final

from sluicegate.gateway.config import ConfigError, ServerConfig
from sluicegate.transport.channel import MINIMUM_VERSION

# Short names of the attributes of a distinguished name (RFC 4514 §3), as RabbitMQ writes them.
_SHORT_NAMES: Final = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
# RFC 4514 §2.4: characters escaped in an attribute value.
_SPECIAL: Final = frozenset(',+"\\<>;')


def server_context(config: ServerConfig) -> ssl.SSLContext | None:
    """A server context for ``tls_cert_file`` and ``tls_key_file``, or None if TLS is off."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # RabbitMQ's default too.
    context.minimum_version = MINIMUM_VERSION
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"tls_cert_file: cannot load certificate and key: {error}") from None
    if config.tls_ca_file is not None:
        # RabbitMQ's verify_peer: a client may send a certificate, which must chain to these
        # CAs; without one it logs in otherwise (fail_if_no_peer_cert = false), unless
        # tls_fail_if_no_peer_cert.
        try:
            context.load_verify_locations(config.tls_ca_file)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(f"tls_ca_file: cannot load CA certificates: {error}") from None
        required = config.tls_fail_if_no_peer_cert
        context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    return context


def certificate_subject(certificate: Mapping[str, object]) -> str | None:
    """A verified client certificate's subject as RabbitMQ names its user (its default
    ``ssl_cert_login_from = distinguished_name``): RFC 4514, last RDN first, e.g.
    ``O=client,CN=localhost`` for a certificate whose subject is CN=localhost, O=client."""
    subject = certificate.get("subject")
    if not isinstance(subject, tuple) or not subject:
        return None
    rdns = []
    for rdn in reversed(subject):
        parts = []
        for attribute, value in rdn:
            name = _SHORT_NAMES.get(attribute, attribute)
            escaped = "".join(f"\\{c}" if c in _SPECIAL else c for c in str(value))
            parts.append(f"{name}={escaped}")
        rdns.append("+".join(parts))
    return ",".join(rdns)
