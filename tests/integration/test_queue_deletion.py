"""A queue's deletion detaches its own links, and looks at no other (gateway/queue_links.py).

Deleting a queue used to walk every session and publisher of the server to find its links, so
a client whose dynamic links come and go (each detach deletes a temporary queue) made the reactor
walk every other client's links once per detach.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import pytest
from integration.conftest import RunningServer
from proton import symbol, uint
from support.frames import described, encode_frame
from support.polling import wait_until
from support.prober import ROUND_TIMEOUT, Prober
from support.raw_client import RawClient

from sluicegate.clients.management import ManagementClient

# Links the bystander holds per role, over QUEUES queues: what every deletion used to walk.
HELD: Final = 1500
QUEUES: Final = 50
# Dynamic links the churner attaches and detaches per wave, in one write each.
WAVE: Final = 100
WAVES: Final = 5
# A multiple field may carry its one value alone (AMQP 1.0 §1.6.3 multiple).
TEMPORARY: Final = symbol("temporary-queue")


def _hold(client: RawClient) -> dict[tuple[int, int], str]:
    """Attach HELD consumers on channel 0 and HELD publishers on channel 1, in one write;
    return each link's name by its channel and the server's handle."""
    client.begin(0)
    client.begin(1)
    frames = b"".join(
        encode_frame(
            0,
            described(
                "attach",
                name=f"c{n}",
                handle=uint(n),
                role=True,
                source=described("source", address=f"/queues/held-{n % QUEUES}"),
                target=described("target"),
            ),
        )
        + encode_frame(
            1,
            described(
                "attach",
                name=f"p{n}",
                handle=uint(HELD + n),
                role=False,
                source=described("source"),
                target=described("target", address=f"/queues/held-{n % QUEUES}"),
                initial_delivery_count=uint(0),
            ),
        )
        for n in range(HELD)
    )
    client.send_raw(frames)
    names: dict[tuple[int, int], str] = {}
    while len(names) < 2 * HELD:
        frame = client.next_frame(60)
        assert frame is not None, f"{2 * HELD - len(names)} attaches unanswered"
        if frame.performative == "attach":
            # A refusal nulls the server's terminus: the target of its receivers (role true).
            assert frame["target" if frame["role"] else "source"] is not None, frame
            names[frame.channel, int(frame["handle"])] = frame["name"]
    return names


class _Churn(threading.Thread):
    """Waves of dynamic consumers: attach WAVE, then detach them all, each deleting its queue."""

    def __init__(self, client: RawClient) -> None:
        super().__init__(name="churn", daemon=True)
        self.client = client
        self.detached = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._churn()
        except BaseException as error:  # reported by the test
            self.failure = error

    def _churn(self) -> None:
        client = self.client
        client.begin(0)
        for _ in range(WAVES):
            client.send_raw(
                b"".join(
                    encode_frame(
                        0,
                        described(
                            "attach",
                            name=f"d{n}",
                            handle=uint(n),
                            role=True,
                            source=described("source", dynamic=True, capabilities=TEMPORARY),
                            target=described("target"),
                        ),
                    )
                    for n in range(WAVE)
                )
            )
            attached = 0
            while attached < WAVE:
                frame = client.next_frame(30)
                assert frame is not None, "dynamic attaches unanswered"
                if frame.performative == "attach":
                    assert frame["source"] is not None, "a dynamic consumer was refused"
                    attached += 1
            client.send_raw(
                b"".join(
                    encode_frame(0, described("detach", handle=uint(n), closed=True))
                    for n in range(WAVE)
                )
            )
            answered = 0
            while answered < WAVE:
                frame = client.next_frame(30)
                assert frame is not None, "dynamic detaches unanswered"
                answered += frame.performative == "detach"
            self.detached += answered


@pytest.mark.alone  # bounds a latency: docs/testing.md
def test_a_deleted_queue_detaches_its_own_links_and_no_others(
    make_server: Callable[..., RunningServer],
) -> None:
    """While a bystander holds 2 x 1,500 links, a churner's 500 temporary queues come and go
    and other clients are served; a queue deleted over management detaches exactly its
    consumers and publishers with amqp:resource-deleted; nothing is kept once all have left."""
    running = make_server(max_links_per_session=2 * HELD)
    links = running.server.broker.queue_links
    with RawClient.connect(running.host, running.port, timeout=60) as bystander:
        names = _hold(bystander)
        with (
            RawClient.connect(running.host, running.port) as churner,
            Prober(running.url) as prober,
        ):
            churn = _Churn(churner)
            churn.start()
            churn.join(timeout=120)
        assert churn.failure is None, churn.failure
        assert churn.detached == WAVE * WAVES
        seen = prober.seen
        assert seen.failures == []
        assert seen.worst < ROUND_TIMEOUT / 2, seen.rounds
        assert running.call(lambda: running.server.registry.get("held-0")) is not None
        with ManagementClient(running.url) as management:
            assert management.request("DELETE", "/queues/held-0").ok
        expected = {f"{role}{n}" for n in range(0, HELD, QUEUES) for role in "cp"}
        detached: set[str] = set()
        while detached != expected:
            frame = bystander.next_frame(10)
            assert frame is not None, f"{sorted(expected - detached)} not detached"
            if frame.performative == "detach":
                assert frame["error"]["condition"] == symbol("amqp:resource-deleted")
                detached.add(names[frame.channel, int(frame["handle"])])
        late = bystander.expect_nothing(0.3)
        assert [frame for frame in late if frame.performative == "detach"] == []
        # The other queues' consumers and publishers.
        assert running.call(lambda: len(links)) == 2 * (QUEUES - 1)
    wait_until(lambda: running.call(lambda: len(links)) == 0, timeout=30)
