"""The TLS context of the amqps:// listener, from the certificate and key in the config."""

from __future__ import annotations

import ssl

from sluicegate.gateway.config import ConfigError, ServerConfig


def server_context(config: ServerConfig) -> ssl.SSLContext | None:
    """A server context for ``tls_cert_file`` and ``tls_key_file``, or None if TLS is off."""
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    # TLS 1.2 is the oldest version without known practical attacks; RabbitMQ's default too.
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"tls_cert_file: cannot load certificate and key: {error}") from None
    return context
