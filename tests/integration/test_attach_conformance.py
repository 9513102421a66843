"""The ATTACH reply states what is in force (AMQP 1.0 §2.7.3), field by field.

Each settle mode a client may ask, on each kind of link (publisher, consumer, either half of
the management pair), is either stated back as asked and then worked by, or refused with
``amqp:not-implemented`` after a null terminus; never replaced by another mode in the reply
(go-amqp, under RabbitMQ's Go client, refuses a link whose reply states another mode than it
asked). A field the client omits has its spec default (mixed, first) stated.
"""

from __future__ import annotations

import itertools
from typing import Final, Literal

import pytest
from integration.conftest import RunningServer
from support.raw_client import Attached, RawClient, Role

SndMode = Literal["unsettled", "settled", "mixed"]
RcvMode = Literal["first", "second"]

SND_MODES: Final[tuple[SndMode | None, ...]] = ("unsettled", "settled", "mixed", None)
RCV_MODES: Final[tuple[RcvMode | None, ...]] = ("first", "second", None)
# §2.8.2 and §2.8.3: the encoded values, and the defaults an omitted field means.
SND_CODES: Final = {"unsettled": 0, "settled": 1, "mixed": 2, None: 2}
RCV_CODES: Final = {"first": 0, "second": 1, None: 0}
MODES: Final = list(itertools.product(SND_MODES, RCV_MODES))


def _attach(
    client: RawClient,
    role: Role,
    address: str,
    snd: SndMode | None,
    rcv: RcvMode | None,
) -> tuple[int, Attached]:
    name = f"{role}-{address}-{snd}-{rcv}"
    if role == "sender":
        handle = client.attach(
            name, role, source=name, target=address, snd_settle_mode=snd, rcv_settle_mode=rcv
        )
    else:
        handle = client.attach(
            name, role, source=address, target=name, snd_settle_mode=snd, rcv_settle_mode=rcv
        )
    return handle, client.wait_attach(handle)


def _modes(attached: Attached) -> tuple[int, int]:
    """The modes the reply states, an omitted field read as its default."""
    snd, rcv = attached.frame["snd_settle_mode"], attached.frame["rcv_settle_mode"]
    return (2 if snd is None else int(snd), 0 if rcv is None else int(rcv))


def _check(
    attached: Attached, snd: SndMode | None, rcv: RcvMode | None, refused: bool, ours: str
) -> None:
    # Honoured or not, the reply states the client's modes: a refusal is the DETACH's.
    assert _modes(attached) == (SND_CODES[snd], RCV_CODES[rcv])
    if refused:
        assert attached.frame[ours] is None
        assert attached.error is not None
        assert attached.error["condition"] == "amqp:not-implemented"
    else:
        assert attached.error is None
        assert attached.frame[ours] is not None


@pytest.mark.parametrize(("snd", "rcv"), MODES)
def test_publisher_attach_states_the_modes_asked_or_refuses_rcv_second(
    server: RunningServer, snd: SndMode | None, rcv: RcvMode | None
) -> None:
    """The server receives: it settles as it gives the outcome, so ``second`` (wait for the
    client's settlement) is refused unless the client sends settled, as RabbitMQ does."""
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        handle, attached = _attach(client, "sender", "/queues/attach-pub", snd, rcv)
        refused = rcv == "second" and snd != "settled"
        _check(attached, snd, rcv, refused, "target")
        if refused:
            return
        assert attached.frame["role"] is True  # §2.8.1: the server is the receiver
        assert attached.target_address == "/queues/attach-pub"
        client.wait_credit(handle)
        delivery = client.send(handle, b"\x00\x53\x75\xa0\x01x", settled=snd == "settled")
        if snd != "settled":
            outcome = client.wait_outcomes([delivery])[delivery]
            assert outcome is not None
            assert outcome.name == "accepted"


@pytest.mark.parametrize(("snd", "rcv"), MODES)
def test_consumer_attach_states_the_modes_asked_and_sends_by_them(
    server: RunningServer, snd: SndMode | None, rcv: RcvMode | None
) -> None:
    """The server sends: every mode is honoured; settled sends settled transfers, unsettled
    and mixed unsettled ones, which the server settles when the client's outcome comes (what
    ``second`` waits for)."""
    queue = f"attach-con-{snd}-{rcv}"
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        publisher, _ = _attach(client, "sender", f"/queues/{queue}", "settled", None)
        client.wait_credit(publisher)
        client.send(publisher, b"\x00\x53\x75\xa0\x01x", settled=True)
        handle, attached = _attach(client, "receiver", f"/queues/{queue}", snd, rcv)
        _check(attached, snd, rcv, False, "source")
        assert attached.frame["role"] is False  # the server is the sender
        assert attached.source_address == f"/queues/{queue}"
        assert attached.frame["initial_delivery_count"] == 0
        client.flow(handle, link_credit=1)
        delivery = client.next_message(timeout=10)
        assert delivery is not None
        assert delivery.settled is (snd == "settled")
        if not delivery.settled:
            client.disposition(delivery.delivery_id, settled=False, state="accepted")
            settled = client.wait_for("disposition", timeout=10)
            assert settled["settled"] is True
        server.call(lambda: None)
        assert server.queue(queue).unacked == 0


@pytest.mark.parametrize(("snd", "rcv"), MODES)
def test_management_request_link_states_the_modes_asked_or_refuses_rcv_second(
    server: RunningServer, snd: SndMode | None, rcv: RcvMode | None
) -> None:
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        _, attached = _attach(client, "sender", "/management", snd, rcv)
        _check(attached, snd, rcv, rcv == "second" and snd != "settled", "target")


@pytest.mark.parametrize(("snd", "rcv"), MODES)
def test_management_reply_link_states_the_modes_asked_or_refuses_unsettled(
    server: RunningServer, snd: SndMode | None, rcv: RcvMode | None
) -> None:
    """The node sends its replies settled: settled and mixed are honoured, unsettled not."""
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        _, attached = _attach(client, "receiver", "/management", snd, rcv)
        _check(attached, snd, rcv, snd == "unsettled", "source")


def test_a_refused_mode_leaves_the_connection_and_its_other_links_working(
    server: RunningServer,
) -> None:
    with RawClient.connect(server.host, server.port) as client:
        client.begin()
        _, refused = _attach(client, "sender", "/queues/attach-other", "unsettled", "second")
        assert refused.error is not None
        handle, attached = _attach(client, "sender", "/queues/attach-other", "unsettled", "first")
        assert attached.error is None
        client.wait_credit(handle)
        delivery = client.send(handle, b"\x00\x53\x75\xa0\x01x")
        outcome = client.wait_outcomes([delivery])[delivery]
        assert outcome is not None
        assert outcome.name == "accepted"
