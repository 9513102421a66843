"""The server side of AMQP 1.0 SASL (part 5.3), in front of proton's transport.

Proton's built-in server SASL offers only ANONYMOUS and EXTERNAL (docs/design.md); PLAIN with
a Python user check would need Cyrus SASL compiled into proton and users kept in a sasldb. So
sluicegate runs the SASL exchange itself, on the bytes before proton sees any: the client's SASL
header, our mechanisms, its sasl-init, our sasl-outcome. After an ``ok`` outcome every further
byte (the client's AMQP header onwards) goes to a proton transport that has no SASL layer.

A client that starts with the plain AMQP header skips SASL: that is an anonymous login, allowed
where ANONYMOUS is. Any other first bytes go to proton untouched, which answers them with
``amqp:connection:framing-error`` as before.

This class only turns bytes into bytes and a verdict; it never touches a socket or a clock.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from proton import UNDESCRIBED, Array, Data, Described, symbol, ubyte, ulong

from sluicegate.gateway.proton.internals import PythonAMQPData
from sluicegate.gateway.rules.auth import User

AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
_FRAME_HEADER: Final = struct.Struct(">IBBH")
_SASL_FRAME_TYPE: Final = 0x01
_SASL_MECHANISMS: Final = 0x40
_SASL_INIT: Final = 0x41
_SASL_OUTCOME: Final = 0x44
# §5.3.1: a SASL frame may be at most 512 bytes unless both peers agreed otherwise, which they
# cannot before SASL is done. Some clients send long hostnames, so a little more is tolerated.
MAX_SASL_FRAME: Final = 4096


class SaslCode(int, Enum):
    """sasl-code (§5.3.3.6)."""

    OK = 0
    AUTH = 1
    SYS = 2
    SYS_PERM = 3
    SYS_TEMP = 4


class Phase(Enum):
    """Where the exchange is."""

    HEADER = "header"
    INIT = "init"
    # A PLAIN password is being checked off the reactor thread; see :meth:`SaslServer.verified`.
    VERIFYING = "verifying"
    DONE = "done"
    FAILED = "failed"


@dataclass(slots=True)
class Step:
    """What one :meth:`SaslServer.feed` produced.

    ``output`` goes to the client before anything proton writes; ``passthrough`` goes to proton
    (only once the phase is DONE); ``close`` says to drop the connection once output is written;
    ``verify`` is a (user name, password) to check, whose verdict goes to ``verified``.
    """

    output: bytes = b""
    passthrough: bytes = b""
    close: bool = False
    verify: tuple[str, bytes] | None = None


def _encode(descriptor: int, fields: list[PythonAMQPData]) -> bytes:
    data = Data()
    data.put_object(Described(ulong(descriptor), fields))
    body: bytes = data.encode()
    return _FRAME_HEADER.pack(_FRAME_HEADER.size + len(body), 2, _SASL_FRAME_TYPE, 0) + body


@dataclass(slots=True)
class SaslServer:
    """One connection's SASL exchange.

    ``anonymous`` is the user of an anonymous login, or None where ANONYMOUS is not allowed.
    A PLAIN login asks its caller to check the password (a step with ``verify``): checking a
    salted scrypt hash takes tens of milliseconds, too long for the reactor thread.
    ``peer_subject`` gives the subject of the client's verified TLS certificate, if it sent
    one: EXTERNAL is then offered, and logs in as the user of that name in ``users``, as
    RabbitMQ's rabbitmq_auth_mechanism_ssl does.
    """

    anonymous: User | None
    offer_plain: bool = True
    users: Mapping[str, User] = field(default_factory=dict)
    peer_subject: Callable[[], str | None] | None = None
    phase: Phase = Phase.HEADER
    user: User | None = None
    # Why the login failed, for the server's log; never sent to the client.
    failure: str = ""
    _buffer: bytearray = field(default_factory=bytearray)

    @property
    def mechanisms(self) -> list[str]:
        """The mechanisms offered, strongest first."""
        offered = ["PLAIN"] if self.offer_plain else []
        offered += ["ANONYMOUS"] if self.anonymous is not None else []
        subject = self.peer_subject() if self.peer_subject is not None else None
        return offered + (["EXTERNAL"] if subject is not None else [])

    def feed(self, data: bytes) -> Step:
        """Take bytes from the client; what to write back and what proton gets."""
        if self.phase is Phase.DONE:
            return Step(passthrough=data)
        if self.phase is Phase.FAILED:
            return Step()
        self._buffer += data
        if self.phase is Phase.VERIFYING:
            return Step()
        if self.phase is Phase.HEADER:
            return self._header()
        return self._init()

    def _header(self) -> Step:
        buffer = self._buffer
        if len(buffer) < len(SASL_HEADER):
            if SASL_HEADER.startswith(buffer) or AMQP_HEADER.startswith(buffer):
                return Step()
            return self._pass_everything()
        header = bytes(buffer[: len(SASL_HEADER)])
        if header == SASL_HEADER:
            del buffer[: len(SASL_HEADER)]
            self.phase = Phase.INIT
            symbols = (symbol(m) for m in self.mechanisms)
            offered = Array(UNDESCRIBED, Data.SYMBOL, *symbols)  # type: ignore[arg-type]
            mechanisms = SASL_HEADER + _encode(_SASL_MECHANISMS, [offered])
            step = self._init()
            step.output = mechanisms + step.output
            return step
        if header == AMQP_HEADER and self.anonymous is None:
            # §5.3.1: answer with the header of the protocol we want, then close.
            self.phase = Phase.FAILED
            self.failure = "a client without SASL where anonymous logins are not allowed"
            return Step(output=SASL_HEADER, close=True)
        if header == AMQP_HEADER:
            self.user = self.anonymous
        return self._pass_everything()

    def _pass_everything(self) -> Step:
        self.phase = Phase.DONE
        if self.user is None:
            self.user = self.anonymous
        passthrough = bytes(self._buffer)
        self._buffer.clear()
        return Step(passthrough=passthrough)

    def _init(self) -> Step:
        buffer = self._buffer
        if len(buffer) < _FRAME_HEADER.size:
            return Step()
        size, doff, frame_type, _ = _FRAME_HEADER.unpack_from(buffer)
        if size > MAX_SASL_FRAME or doff < 2 or size < doff * 4 or frame_type != _SASL_FRAME_TYPE:
            return self._fail(SaslCode.SYS_PERM, f"bad SASL frame (size {size}, type {frame_type})")
        if len(buffer) < size:
            return Step()
        body = bytes(buffer[doff * 4 : size])
        del buffer[:size]
        mechanism, response = self._decode_init(body)
        if mechanism is None:
            return self._fail(SaslCode.SYS_PERM, "the client sent no valid sasl-init")
        if mechanism == "ANONYMOUS":
            if self.anonymous is None:
                self.failure = "ANONYMOUS is not allowed here"
            return self.verified(self.anonymous)
        if mechanism == "EXTERNAL":
            return self.verified(self._external())
        credentials = self._plain(mechanism, response)
        if credentials is None:
            return self._fail(SaslCode.AUTH, self.failure)
        self.phase = Phase.VERIFYING
        self.failure = f"wrong user name or password for {credentials[0]!r}"
        return Step(verify=credentials)

    @property
    def held(self) -> int:
        """Bytes received and not passed on yet (those that came during a password check)."""
        return len(self._buffer)

    def busy(self) -> Step:
        """The password cannot be checked now (too many checks waiting): try again later."""
        return self._fail(SaslCode.SYS_TEMP, "too many password checks waiting")

    def verified(self, user: User | None) -> Step:
        """The verdict on the login: the outcome, and the bytes that came meanwhile for proton."""
        if user is None:
            return self._fail(SaslCode.AUTH, self.failure)
        self.user = user
        self.phase = Phase.DONE
        rest = bytes(self._buffer)
        self._buffer.clear()
        return Step(output=_encode(_SASL_OUTCOME, [ubyte(SaslCode.OK)]), passthrough=rest)

    @staticmethod
    def _decode_init(body: bytes) -> tuple[str | None, bytes]:
        data = Data()
        try:
            data.decode(body)
            performative = data.get_object()
        except Exception:  # proton raises DataException and others on hostile bytes
            return None, b""
        if not isinstance(performative, Described) or performative.descriptor not in (
            _SASL_INIT,
            symbol("amqp:sasl-init:list"),
        ):
            return None, b""
        fields = performative.value if isinstance(performative.value, list) else []
        mechanism = fields[0] if fields else None
        response = fields[1] if len(fields) > 1 else None
        if not isinstance(mechanism, str):
            return None, b""
        # proton decodes binary as a memoryview into its own buffer: copy it out.
        return str(mechanism), bytes(response) if isinstance(response, memoryview | bytes) else b""

    def _external(self) -> User | None:
        """The user a verified client certificate names; the response (an authorization
        identity) is not read: the certificate alone says who the client is."""
        subject = self.peer_subject() if self.peer_subject is not None else None
        if subject is None:
            self.failure = "EXTERNAL without a verified client certificate"
            return None
        user = self.users.get(subject)
        if user is None:
            self.failure = f"no user {subject!r} for the client certificate"
        return user

    def _plain(self, mechanism: str, response: bytes) -> tuple[str, bytes] | None:
        if mechanism != "PLAIN" or not self.offer_plain:
            self.failure = f"mechanism {mechanism!r} not offered"
            return None
        # RFC 4616: [authzid] NUL authcid NUL passwd
        parts = response.split(b"\x00")
        if len(parts) != 3:
            self.failure = "malformed PLAIN response"
            return None
        authzid, username, password = parts
        try:
            name = username.decode()
        except UnicodeDecodeError:
            self.failure = "PLAIN user name is not UTF-8"
            return None
        if authzid and authzid != username:
            self.failure = f"user {name!r} may not act as another user"
            return None
        return name, password

    def _fail(self, code: SaslCode, reason: str) -> Step:
        self.phase = Phase.FAILED
        self.failure = reason
        return Step(output=_encode(_SASL_OUTCOME, [ubyte(code)]), close=True)
