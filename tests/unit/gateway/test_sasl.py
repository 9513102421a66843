"""The SASL exchange and certificate subjects as plain objects, without a socket."""

from __future__ import annotations

import pytest

from sluicegate.gateway.rules.auth import (
    anonymous_user,
    check_plain,
    hash_password,
    parse_users,
)
from sluicegate.gateway.sasl import AMQP_HEADER, SASL_HEADER, Phase, SaslServer
from sluicegate.gateway.tls import certificate_subject

_USERS = parse_users({"alice": {"password_hash": hash_password("pw")}})


def _server(anonymous: bool = True) -> SaslServer:
    return SaslServer(anonymous_user(_USERS) if anonymous else None)


def _plain_init(response: bytes) -> bytes:
    return _sasl_init_frame("PLAIN", response)


def _sasl_init_frame(mechanism: str, response: bytes) -> bytes:
    from proton import Data, Described, symbol, ulong

    data = Data()
    data.put_object(Described(ulong(0x41), [symbol(mechanism), response]))
    body = data.encode()
    return (8 + len(body)).to_bytes(4, "big") + b"\x02\x01\x00\x00" + body


def test_bytes_arriving_one_at_a_time_reach_the_same_verdict() -> None:
    server = _server()
    output = b""
    passthrough = b""
    # The client pipelines its AMQP header: it waits in the SASL layer until the verdict.
    for byte in SASL_HEADER + _plain_init(b"\0alice\0pw") + AMQP_HEADER:
        step = server.feed(bytes([byte]))
        if step.verify is not None:
            assert server.phase is Phase.VERIFYING
            assert step.verify == ("alice", b"pw")
            step = server.verified(check_plain(_USERS, *step.verify))
        output += step.output
        passthrough += step.passthrough
        assert not step.close
    assert server.phase is Phase.DONE
    assert server.user is not None
    assert server.user.name == "alice"
    assert output.startswith(SASL_HEADER)
    assert passthrough == AMQP_HEADER


def test_a_wrong_password_fails_after_the_check() -> None:
    server = _server()
    step = server.feed(SASL_HEADER + _plain_init(b"\0alice\0nope"))
    assert step.verify == ("alice", b"nope")
    verdict = server.verified(check_plain(_USERS, *step.verify))
    assert verdict.close
    assert server.phase is Phase.FAILED
    assert "alice" not in verdict.output.decode("latin-1")


@pytest.mark.parametrize(
    "garbage",
    [b"\x00\x00\x20\x00\x02\x01\x00\x00", b"\x00\x00\x00\x09\x02\x00\x00\x00\x00", b"\xff" * 64],
)
def test_a_malformed_sasl_frame_fails_the_login(garbage: bytes) -> None:
    server = _server()
    step = server.feed(SASL_HEADER + garbage)
    assert step.close
    assert server.phase is Phase.FAILED
    assert server.user is None
    assert server.feed(AMQP_HEADER).passthrough == b""


def test_a_certificate_subject_is_named_as_rabbitmq_names_its_user() -> None:
    certificate = {
        "subject": (
            (("commonName", "localhost"),),
            (("organizationName", "client, inc"),),
            (("organizationalUnitName", "a"), ("userId", "u+1")),
        )
    }
    assert certificate_subject(certificate) == "OU=a+UID=u\\+1,O=client\\, inc,CN=localhost"
    assert certificate_subject({}) is None


def test_external_logs_in_as_the_certificate_subjects_user_only() -> None:
    users = parse_users({"O=client,CN=localhost": {"password_hash": ""}})
    subject: list[str | None] = ["O=client,CN=localhost"]
    sasl = SaslServer(None, users=users, peer_subject=lambda: subject[0])
    assert sasl.mechanisms == ["PLAIN", "EXTERNAL"]
    step = sasl.feed(SASL_HEADER + _sasl_init_frame("EXTERNAL", b""))
    assert sasl.phase is Phase.DONE
    assert sasl.user is not None
    assert sasl.user.name == "O=client,CN=localhost"
    assert step.output.endswith(b"\x00")  # sasl-outcome code ok
    subject[0] = "O=other,CN=localhost"
    stranger = SaslServer(None, users=users, peer_subject=lambda: subject[0])
    stranger.feed(SASL_HEADER + _sasl_init_frame("EXTERNAL", b""))
    assert (stranger.phase, stranger.user) == (Phase.FAILED, None)
    subject[0] = None
    without = SaslServer(None, users=users, peer_subject=lambda: subject[0])
    assert "EXTERNAL" not in without.mechanisms
    without.feed(SASL_HEADER + _sasl_init_frame("EXTERNAL", b""))
    assert without.phase is Phase.FAILED
