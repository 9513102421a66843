"""Interoperability with rhea, the Node.js AMQP 1.0 client.

The node scripts in ``js/`` (``send.js``, ``receive.js``, ``drain.js``, ``roundtrip.js``,
``rpc.js``) each
print one JSON line of results; these tests run them against the ``server`` fixture and assert on
counts and orders.  rhea connects without SASL unless given a user name, and advertises a session
incoming window of 2,048 transfers.  Needs ``node`` and ``npm ci --prefix tests/integration/js``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any, Protocol

import pytest
from integration.conftest import RunningServer
from proton import Message, symbol
from proton.utils import BlockingConnection

JS_DIR = Path(__file__).resolve().parent / "js"

_node = shutil.which("node")
if _node is None:
    pytest.skip("node (Node.js) is not installed: the rhea tests need it", allow_module_level=True)
if not (JS_DIR / "node_modules" / "rhea" / "package.json").is_file():
    pytest.skip(
        "rhea is not installed: run `npm ci --prefix tests/integration/js`",
        allow_module_level=True,
    )
NODE: str = _node

# A script's own deadline (it exits 3 with its progress on stderr), and the harder one of
# subprocess.run() a few seconds later in case node itself hangs. Only a hang guard: 1,000
# messages at credit 1 took over 10 s on a 2-core machine at load 13 (tests in 4 processes).
SCRIPT_TIMEOUT_S = 30.0
# A drain must be answered at once: this only bounds the wait, it is no speed assertion.
DRAIN_TIMEOUT_S = 5.0
PROTON_TIMEOUT_S = 10.0


class Server(Protocol):
    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def url(self) -> str: ...


def queue_name(request: pytest.FixtureRequest) -> str:
    """A queue of the test's own: its name plus a random suffix (a server may keep queues)."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name).strip("-")
    return f"rhea-{stem}-{uuid.uuid4().hex[:8]}"


def run_js(
    script: str,
    server: Server,
    address: str,
    count: int,
    *options: str,
    timeout: float = SCRIPT_TIMEOUT_S,
) -> dict[str, Any]:
    """Runs js/SCRIPT against the server and returns its JSON result (failing on an error)."""
    argv = [
        NODE,
        str(JS_DIR / script),
        server.host,
        str(server.port),
        address,
        str(count),
        f"--timeout={timeout:g}",
        *options,
    ]
    try:
        proc = subprocess.run(
            argv, cwd=JS_DIR, capture_output=True, text=True, timeout=timeout + 5, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} hung past its own {timeout:g}s timeout: {exc.stderr!r}")
    if proc.returncode != 0:
        pytest.fail(
            f"{script} {' '.join(argv[3:])} exited {proc.returncode}:\n"
            f"{proc.stderr.strip()}\nstdout: {proc.stdout.strip()}"
        )
    lines = proc.stdout.strip().splitlines()
    assert lines, f"{script} printed nothing (stderr: {proc.stderr.strip()})"
    result: dict[str, Any] = json.loads(lines[-1])
    # rhea's own complaints about the peer, e.g. "Received transfer when credit was 0".
    assert result["warnings"] == [], f"rhea reported protocol trouble: {result['warnings']}"
    return result


def rhea_send(server: Server, address: str, count: int, *options: str) -> None:
    result = run_js("send.js", server, address, count, *options)
    assert result["sent"] == count
    assert result["accepted"] == count, result
    assert result["rejected"] == result["released"] == result["modified"] == 0, result
    assert result["no_outcome"] == 0, result


def rhea_receive(server: Server, address: str, count: int, *options: str) -> dict[str, Any]:
    result = run_js("receive.js", server, address, count, *options)
    assert result["received"] == count
    assert result["extra"] == 0, "a message arrived past the count: was credit respected?"
    return result


@pytest.mark.parametrize(
    "receive_options",
    [
        pytest.param((), id="default-window"),
        pytest.param(("--credit-window=10",), id="window-10"),
        pytest.param(("--credit=50",), id="manual-credit-50"),
        pytest.param(("--credit=1",), id="manual-credit-1"),
        pytest.param(("--credit=100", "--settle=at-most-once"), id="at-most-once"),
    ],
)
def test_rhea_to_rhea_1000_in_order(
    server: Server, request: pytest.FixtureRequest, receive_options: tuple[str, ...]
) -> None:
    address = queue_name(request)
    rhea_send(server, address, 1000)
    result = rhea_receive(server, address, 1000, *receive_options)
    assert result["indices"] == list(range(1000))
    assert result["delivery_counts"] == [0] * 1000
    assert result["body_types"] == {"string": 1000}


def test_rhea_publishes_over_three_links_of_one_name_on_one_session(
    server: Server, request: pytest.FixtureRequest
) -> None:
    """RabbitMQ accepts repeated link names (it keys links by handle), and so does sluicegate,
    although proton-c, under it, refuses them: the names are made unique between the socket and
    proton and rhea reads its own names back (docs/management.md)."""
    address = queue_name(request)
    rhea_send(server, address, 300, "--senders=3", "--link-name=one-name")
    assert rhea_receive(server, address, 300)["indices"] == list(range(300))


@pytest.mark.parametrize("form", ["bare", "queues-prefix"])
def test_rhea_address_forms(server: Server, request: pytest.FixtureRequest, form: str) -> None:
    name = queue_name(request)
    address = name if form == "bare" else f"/queues/{name}"
    rhea_send(server, address, 20)
    assert rhea_receive(server, address, 20)["indices"] == list(range(20))


def test_rhea_credit_window_beyond_session_window(
    server: Server, request: pytest.FixtureRequest
) -> None:
    """Link credit 3,000 > rhea's session incoming window of 2,048: the server must keep to both."""
    address = queue_name(request)
    rhea_send(server, address, 3000)
    result = rhea_receive(server, address, 3000, "--credit-window=3000")
    assert result["indices"] == list(range(3000))


def test_rhea_with_sasl_anonymous(server: Server, request: pytest.FixtureRequest) -> None:
    """rhea only does SASL when given a user name: with one (and no password) it uses ANONYMOUS."""
    address = queue_name(request)
    rhea_send(server, address, 10, "--username=rhea-test")
    result = rhea_receive(server, address, 10, "--username=rhea-test")
    assert result["indices"] == list(range(10))


def test_proton_publishes_rhea_receives(server: Server, request: pytest.FixtureRequest) -> None:
    address = queue_name(request)
    conn = BlockingConnection(server.url, timeout=PROTON_TIMEOUT_S)
    try:
        sender = conn.create_sender(address)
        for i in range(200):
            # send() waits for the outcome and raises unless the message is accepted.
            sender.send(Message(body=f"{i}", properties={"i": i}))
    finally:
        conn.close()
    result = rhea_receive(server, address, 200, "--credit-window=30")
    assert result["indices"] == list(range(200))
    assert result["body_types"] == {"string": 200}


@pytest.mark.parametrize("body", ["string", "binary", "data"])
def test_rhea_publishes_proton_receives(
    server: Server, request: pytest.FixtureRequest, body: str
) -> None:
    """Bodies: an AMQP string, a binary amqp-value and a data section."""
    address = queue_name(request)
    rhea_send(server, address, 200, f"--body={body}")
    conn = BlockingConnection(server.url, timeout=PROTON_TIMEOUT_S)
    indices: list[int] = []
    try:
        receiver = conn.create_receiver(address, credit=25)
        for _ in range(200):
            message = receiver.receive(timeout=PROTON_TIMEOUT_S)
            receiver.accept()
            # (proton's stubs type Message.properties as None: it starts out so)
            properties: dict[str, Any] | None = message.properties
            assert properties is not None
            i = int(properties["i"])  # a uint or int from rhea: proton wraps it
            content = message.body
            if body == "string":
                assert content == str(i)
            else:  # proton 0.40 hands out binary as a memoryview
                assert isinstance(content, bytes | memoryview), type(content)
                assert bytes(content) == str(i).encode()
            indices.append(i)
    finally:
        conn.close()
    assert indices == list(range(200))


def test_drain_on_empty_queue_completes_at_once(
    server: Server, request: pytest.FixtureRequest
) -> None:
    result = run_js("drain.js", server, queue_name(request), 10, timeout=DRAIN_TIMEOUT_S)
    assert result["drained"] is True
    assert result["received"] == 0
    assert result["drain_events"] == 1
    assert result["credit_after_drain"] == 0
    assert result["delivery_count_after_drain"] == 10


def test_drain_with_three_messages_and_credit_ten(
    server: Server, request: pytest.FixtureRequest
) -> None:
    address = queue_name(request)
    rhea_send(server, address, 3)
    result = run_js("drain.js", server, address, 10, timeout=DRAIN_TIMEOUT_S)
    assert result["drained"] is True
    assert result["received"] == 3
    assert result["indices"] == [0, 1, 2]
    assert result["credit_after_drain"] == 0
    assert result["delivery_count_after_drain"] == 10


@pytest.mark.parametrize("count", [1, 3, 300])
def test_drain_whose_messages_use_up_all_the_credit(
    server: Server, request: pytest.FixtureRequest, count: int
) -> None:
    """rhea learns a drain ended only from a FLOW: it must come even when no credit is left."""
    address = queue_name(request)
    rhea_send(server, address, count)
    result = run_js("drain.js", server, address, count, timeout=DRAIN_TIMEOUT_S)
    assert result["drained"] is True
    assert result["received"] == count
    assert result["indices"] == list(range(count))
    assert result["drain_events"] == 1
    assert result["credit_after_drain"] == 0
    assert result["delivery_count_after_drain"] == count


def test_drained_queue_is_empty_after(server: Server, request: pytest.FixtureRequest) -> None:
    """The drain accepted its 3 messages: a second drain finds nothing."""
    address = queue_name(request)
    rhea_send(server, address, 3)
    assert run_js("drain.js", server, address, 10, timeout=DRAIN_TIMEOUT_S)["received"] == 3
    again = run_js("drain.js", server, address, 10, timeout=DRAIN_TIMEOUT_S)
    assert again["drained"] is True
    assert again["received"] == 0


@pytest.mark.parametrize("drain_first", [False, True], ids=["plain", "after-drain"])
def test_roundtrip_on_one_connection(
    server: Server, request: pytest.FixtureRequest, drain_first: bool
) -> None:
    """Sender and receiver on one connection; after a drain the link must go on working."""
    options = ("--drain-first",) if drain_first else ()
    result = run_js("roundtrip.js", server, queue_name(request), 300, *options)
    assert result["sent"] == result["accepted"] == result["received"] == 300
    assert result["indices"] == list(range(300))
    assert result["drained_first"] is drain_first
    assert result["received_before_drain"] == 0


def test_rhea_request_reply_over_direct_reply_to(
    server: Server, request: pytest.FixtureRequest
) -> None:
    """RabbitMQ 4.2's Direct Reply-To: replies reach the requester's dynamic source."""
    result = run_js("rpc.js", server, queue_name(request), 50)
    assert result["reply_address"].startswith("/queues/amq.rabbitmq.reply-to.")
    assert result["sent"] == result["replied"] == result["replies"] == 50
    assert sorted(result["indices"]) == list(range(50))
    assert result["correlated"] is True


def test_rhea_receives_through_a_jms_selector_and_an_sql_filter(
    server: Server, request: pytest.FixtureRequest
) -> None:
    """rhea's own selector filter and an AMQP SQL filter, each echoed as applied."""
    address = queue_name(request)
    rhea_send(server, address, 30)
    selected = rhea_receive(server, address, 10, "--selector=i % 3 = 0", "--idle=0.5")
    assert selected["indices"] == list(range(0, 30, 3))
    assert selected["filters"] == ["jms-selector"]
    sql = rhea_receive(server, address, 6, "--sql=i > 20 AND i % 3 <> 0", "--idle=0.5")
    assert sql["indices"] == [22, 23, 25, 26, 28, 29]
    assert sql["filters"] == ["sql-filter"]


def test_rhea_reads_a_stream_by_its_filter_values(
    server: RunningServer, request: pytest.FixtureRequest
) -> None:
    """RabbitMQ 4.1's stream filter values: only the tagged messages asked for."""
    address = queue_name(request)
    server.call(lambda: server.server.registry.declare_queue(address, {"x-queue-type": "stream"}))
    tags = ["apple", "banana", None, "banana", "cherry"] * 4
    messages = [
        Message(
            body=str(i),
            properties={"i": i},
            annotations=None if tag is None else {symbol("x-stream-filter-value"): tag},
        )
        for i, tag in enumerate(tags)
    ]
    connection = BlockingConnection(server.url, timeout=PROTON_TIMEOUT_S)
    try:
        sender = connection.create_sender(address)
        for message in messages:
            sender.send(message)
    finally:
        connection.close()
    bananas = [i for i, tag in enumerate(tags) if tag == "banana"]
    result = rhea_receive(
        server, address, len(bananas), "--offset=first", "--stream-filter=banana", "--idle=0.5"
    )
    assert result["indices"] == bananas
    assert result["filters"] == ["rabbitmq:stream-filter", "rabbitmq:stream-offset-spec"]


def test_rhea_through_a_quorum_queue(server: RunningServer, request: pytest.FixtureRequest) -> None:
    """A quorum queue serves rhea as any queue: in order, each message once."""
    name = queue_name(request)
    server.call(lambda: server.server.registry.declare_queue(name, {"x-queue-type": "quorum"}))
    rhea_send(server, f"/queues/{name}", 200)
    result = rhea_receive(server, f"/queues/{name}", 200, "--credit-window=25")
    assert result["indices"] == list(range(200))
    assert server.queue(name).ready == 0


@pytest.mark.parametrize("queue_type", ["classic", "quorum", "stream"])
def test_rhea_declares_reads_and_deletes_each_queue_type_over_management(
    server: Server, request: pytest.FixtureRequest, queue_type: str
) -> None:
    """RabbitMQ's management over AMQP from a JS client: the codes RabbitMQ 4.2 answers (201,
    200, 200) and the queue info its clients read, for every queue type (a 501 for quorum
    queues was once read as success by RabbitMQ's JS client, which then hung)."""
    name = queue_name(request)
    result = run_js("management.js", server, name, 3, f"--type={queue_type}")
    assert result["declared"]["status"] == "201"
    assert result["published"] == 3
    info = result["info"]
    assert info["status"] == "200"
    body = info["body"]
    assert body["name"] == name
    assert body["type"] == queue_type
    # RabbitMQ writes {boolean, true} as 0x56 0x01, which rhea reads as 1 (RabbitMQ's JS client
    # compares durable, auto_delete and exclusive with 1).
    assert (body["durable"], body["auto_delete"], body["exclusive"]) == (1, 0, 0)
    assert body["replicas"] == [body["leader"]]
    assert body["leader"].startswith("rabbit@")
    assert body["message_count"] == 3
    assert body["consumer_count"] == 0
    assert body["arguments"]["x-queue-type"] == queue_type
    # RabbitMQ counts what a deleted classic or quorum queue held; its stream coordinator, 0.
    held = 0 if queue_type == "stream" else 3
    assert result["deleted"] == {"status": "200", "body": {"message_count": held}}
