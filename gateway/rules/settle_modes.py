"""The settle modes an ATTACH reply states: the ones in force, or a refusal.

AMQP 1.0 §2.7.3 has the responder state the settle modes it will actually use. Proton's own
link modes default to mixed/first, so unless they are set before ``open()`` the reply says
``snd-settle-mode`` mixed whatever the client asked, and a client that checks the reply (Azure's
go-amqp, under RabbitMQ's Go client) refuses the link. Every mode the server honours is stated
back as the client asked it; a mode it cannot honour refuses the link with
``amqp:not-implemented`` (a null terminus, then a DETACH, as any refused attach), never a
reply that silently states another mode:

- the server sends (a consumer): settled, unsettled and mixed are honoured (under mixed every
  delivery goes unsettled); ``rcv-settle-mode`` first and second both are, since the server
  settles a delivery when the client's outcome arrives, which is what ``second`` waits for;
- the server receives (a publisher, a management request link): every ``snd-settle-mode`` is
  honoured; ``rcv-settle-mode`` second is not (the server settles as it answers, where second
  would have it wait for the client's settlement) unless the client sends settled, when the
  receiver's mode is moot. RabbitMQ refuses the same with the same condition;
- the management node's reply link sends its replies settled: ``unsettled`` is refused.
"""

from __future__ import annotations

from typing import Final

from sluicegate.queues.errors import NotImplementedByServer

# The settle modes' values on the wire (AMQP 1.0 §2.8.2, §2.8.3), which proton's
# ``Link.SND_*`` and ``Link.RCV_*`` are.
SND_UNSETTLED: Final = 0
SND_SETTLED: Final = 1
RCV_SECOND: Final = 1


def refuse_unhonoured(snd: int, rcv: int, *, server_sends: bool, management: bool) -> None:
    """Raise :class:`NotImplementedByServer` if the server cannot work by a link's modes as
    the client's ATTACH asked them (``snd``, ``rcv``); ``server_sends`` on a consumer's link or
    the management node's reply link."""
    if not server_sends and rcv == RCV_SECOND and snd != SND_SETTLED:
        raise NotImplementedByServer(
            "rcv-settle-mode second is not supported on a link the server receives on: "
            "it settles each delivery as it gives the outcome"
        )
    if server_sends and management and snd == SND_UNSETTLED:
        raise NotImplementedByServer(
            "snd-settle-mode unsettled is not supported on the management node's reply "
            "link: it sends its replies settled"
        )
