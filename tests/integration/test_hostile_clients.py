"""No client can stall the reactor or lock others out (issue 17).

Each test runs an attack and, while it runs, a prober (tests/support/prober.py): another real
client that connects, publishes one message and consumes it, again and again. Served, a round
takes about 0.05 s (under a second on a loaded machine); each attack here stalled it for tens of
seconds before the fix. The attacker gets the error the docs promise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from integration.conftest import RunningServer
from proton import Message, uint
from support.clients import publish
from support.frames import described, encode_frame
from support.prober import Prober
from support.raw_client import RawClient

# A served prober's round, with room for a loaded shared machine; the stalls were 10-60 s.
PROBE_BOUND: Final = 5.0


class _AttachStorm(threading.Thread):
    """Attach and detach bursts of consumer links in one write each, until stopped.

    Links are attached on ``sessions`` sessions, ``per_session`` at a time, to a handful of
    queues; beyond the server's limit they are refused, and the storm answers each refusal
    with its DETACH as a proper client does. Frames are written and counted by hand, because
    the raw client's bookkeeping per link would make the attacker the slow side.
    """

    def __init__(self, client: RawClient, sessions: int, per_session: int) -> None:
        super().__init__(name="attach-storm", daemon=True)
        self.client = client
        self.sessions = sessions
        self.per_session = per_session
        self.waves = 0
        self.attached = 0
        self.refusals: set[str] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        client = self.client
        links = self.sessions * self.per_session
        while not self.stopping.is_set():
            attaches = b"".join(
                encode_frame(
                    channel,
                    described(
                        "attach",
                        name=f"storm-{channel}-{n}",
                        handle=uint(n),
                        role=True,
                        source=described("source", address=f"/queues/storm-{n % 8}"),
                        target=described("target"),
                    ),
                )
                for channel in range(self.sessions)
                for n in range(self.per_session)
            )
            client.send_raw(attaches)
            detaches: list[bytes] = []
            served = replies = 0
            while replies < links:
                frame = client.next_frame(30)
                assert frame is not None, f"no answer to {links - replies} of {links} attaches"
                if frame.performative == "attach":
                    replies += 1
                    served += frame["source"] is not None
                    ours = uint(int(frame["name"].rpartition("-")[2]))
                    detach = described("detach", handle=ours, closed=True)
                    detaches.append(encode_frame(frame.channel, detach))
                elif frame.performative == "detach" and frame["error"] is not None:
                    self.refusals.add(frame["error"]["condition"])
            # Refused links were closed by the server already: only served ones are answered.
            client.send_raw(b"".join(detaches))
            answered = 0
            while answered < served:
                frame = client.next_frame(30)
                assert frame is not None, "the storm's detaches were not answered"
                answered += frame.performative == "detach"
            self.attached += served
            self.waves += 1


def test_attach_storms_do_not_stall_other_clients(
    make_server: Callable[..., RunningServer],
) -> None:
    """Each ATTACH costs the same however many links the connection holds (issue 17 §2).

    Checking the per-session limit walked every link of the connection, so 16 x 256 attaches
    in one write took 67 s to answer and no other client could connect meanwhile. Refused
    attaches cost no less than served ones, so the storm attaches past the limit too.
    """
    running = make_server(max_links_per_session=200)
    with RawClient.connect(running.host, running.port) as attacker:
        for channel in range(8):
            attacker.begin(channel)
        storm = _AttachStorm(attacker, sessions=8, per_session=256)
        storm.start()
        try:
            with Prober(running.url) as prober:
                prober.wait_rounds(4, timeout=120)
        finally:
            storm.stopping.set()
            storm.join(120)
    seen = prober.seen
    assert storm.waves >= 1, "the storm did not get through one wave"
    assert seen.failures == []
    assert len(seen.rounds) >= 4
    assert seen.worst < PROBE_BOUND, seen.rounds
    assert storm.attached == storm.waves * 8 * 200
    assert storm.refusals == {"amqp:resource-limit-exceeded"}


def test_refusals_left_unanswered_end_the_session(
    make_server: Callable[..., RunningServer],
) -> None:
    """Refused links stay counted until the client detaches them: past twice the limit, END.

    Otherwise a client that never answers our DETACH could pile up refused links forever.
    """
    running = make_server(max_links_per_session=4)
    with RawClient.connect(running.host, running.port) as client:
        client.begin()
        handles = [client.attach(f"l{n}", "sender", target="/queues/refusals") for n in range(8)]
        for handle in handles[:4]:
            assert client.wait_attach(handle).error is None
        for handle in handles[4:]:
            error = client.wait_attach(handle).error
            assert error is not None
            assert error["condition"] == "amqp:resource-limit-exceeded"
        client.attach("one-too-many", "sender", target="/queues/refusals")
        end = client.wait_for("end")
        assert end["error"]["condition"] == "amqp:resource-limit-exceeded"
        assert "not detached" in end["error"]["description"]
        # The connection carries on: another session attaches as usual.
        client.begin(channel=1)
        other = client.attach("fresh", "sender", target="/queues/refusals", channel=1)
        assert client.wait_attach(other).error is None


def _consumer(running: RunningServer, queue: str) -> tuple[RawClient, int]:
    client = RawClient.connect(running.host, running.port)
    client.begin()
    handle = client.attach("consumer", "receiver", source=queue, snd_settle_mode="settled")
    assert client.wait_attach(handle).error is None
    return client, handle


def _bodies(client: RawClient, count: int) -> list[object]:
    bodies: list[object] = []
    for _ in range(count):
        delivery = client.next_message()
        assert delivery is not None, f"{len(bodies)} of {count} messages arrived"
        message = Message()
        message.decode(delivery.payload)
        bodies.append(message.body)
    return bodies


def test_link_credit_is_a_uint(server: RunningServer) -> None:
    """A grant of 2**31 or more is credit like any other (issue 17 §8).

    Proton keeps a sending link's credit in a C int, where such a grant reads negative: the
    server used to send nothing at all, silently.
    """
    queue = "/queues/uint-credit"
    assert publish(server.url, queue, ["a", "b", "c"]).outcomes == ["accepted"] * 3
    with _consumer(server, queue)[0] as client:
        client.flow(0, link_credit=2**32 - 1)
        assert _bodies(client, 3) == ["a", "b", "c"]
        assert publish(server.url, queue, ["d"]).outcomes == ["accepted"]
        assert _bodies(client, 1) == ["d"]
        # A drain of such a grant: the message there, then delivery-count moves by the rest.
        assert publish(server.url, queue, ["e"]).outcomes == ["accepted"]
        before = client.links[0].delivery_count
        client.flow(0, link_credit=2**31 + 5, drain=True)
        assert _bodies(client, 1) == ["e"]
        drained = client.wait_for("flow", where=lambda frame: frame["handle"] is not None)
        assert drained["link_credit"] == 0
        assert drained["delivery_count"] == (before + 2**31 + 5) % 2**32


def test_channels_reused_in_a_burst_get_their_answers(server: RunningServer) -> None:
    """120 BEGIN/END pairs on channel 0 in one write: each answered, the connection goes on.

    Proton frees a channel only once our END is encoded, which it did only when writing, so
    the burst ran it out of channels and the connection hung without a word.
    """
    begin = described(
        "begin", next_outgoing_id=uint(0), incoming_window=uint(100), outgoing_window=uint(100)
    )
    pairs = 120
    with RawClient.connect(server.host, server.port) as client:
        client.send_raw((encode_frame(0, begin) + encode_frame(0, described("end"))) * pairs)
        answers = [client.wait_for("end") for _ in range(pairs)]
        assert all(end["error"] is None for end in answers)
        begins = [frame for frame in client.received if frame.performative == "begin"]
        assert len(begins) == pairs
        client.begin()
        handle = client.attach("after-the-burst", "sender", target="/queues/channel-reuse")
        assert client.wait_attach(handle).error is None
