"""The management router against a real queue registry, without proton: paths, bodies, codes."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

import pytest

from sluicegate.gateway.rules.auth import NOBODY, Access
from sluicegate.gateway.rules.management.listing import MAX_UNPAGED
from sluicegate.gateway.rules.management.requests import Caller, Request, Response
from sluicegate.gateway.rules.management.router import Router
from sluicegate.gateway.rules.tenancy import Tenancy
from sluicegate.gateway.rules.vhosts import VhostSettings
from sluicegate.queues import stream as stream_module
from sluicegate.queues.message import Message
from sluicegate.queues.queue_type import Clock
from sluicegate.queues.registry import QueueRegistry
from sluicegate.queues.stream import StreamQueue
from sluicegate.wire.amqp_types import Described, UInt, ULong
from sluicegate.wire.encoding import encode

QUEUE_INFO_KEYS = {
    "name",
    "vhost",
    "durable",
    "auto_delete",
    "exclusive",
    "type",
    "leader",
    "replicas",
    "arguments",
    "message_count",
    "consumer_count",
}


@pytest.fixture
def router() -> Router:
    return Router(QueueRegistry(), node="sluicegate@test")


def put_queue(router: Router, name: str, **body: object) -> Response:
    return router.handle(Request("PUT", f"/queues/{name}", body))


def body_map(response: Response) -> dict[str, object]:
    assert isinstance(response.body, dict)
    return response.body


def test_declare_get_and_redeclare_a_classic_queue(router: Router) -> None:
    body = {"durable": True, "exclusive": False, "auto_delete": False}
    created = put_queue(router, "orders", **body, arguments={"x-queue-type": "classic"})
    assert created.status == 201
    again = put_queue(router, "orders", **body, arguments={"x-queue-type": "classic"})
    assert again.status == 200
    info = body_map(router.handle(Request("GET", "/queues/orders")))
    assert set(info) == QUEUE_INFO_KEYS
    assert info["name"] == "orders"
    assert info["type"] == "classic"
    assert info["durable"] is True
    assert info["leader"] == "sluicegate@test"
    assert info["replicas"] == ["sluicegate@test"]
    assert info["arguments"] == {"x-queue-type": "classic"}
    assert type(info["message_count"]) is ULong
    assert type(info["consumer_count"]) is UInt
    assert info["message_count"] == 0
    assert info["consumer_count"] == 0


def test_a_quorum_style_declaration_without_flags_defaults_to_durable(router: Router) -> None:
    assert put_queue(router, "plain", arguments={}).status == 201
    info = body_map(router.handle(Request("GET", "/queues/plain")))
    assert (info["durable"], info["exclusive"], info["auto_delete"]) == (True, False, False)


def test_an_inequivalent_redeclaration_is_409(router: Router) -> None:
    put_queue(router, "limited", arguments={"x-max-length": 10})
    response = put_queue(router, "limited", arguments={"x-max-length": 20})
    assert response.status == 409
    assert "x-max-length" in str(response.body)
    assert put_queue(router, "limited", durable=False, arguments={"x-max-length": 10}).status == (
        409
    )


def test_bad_bodies_are_400(router: Router) -> None:
    assert router.handle(Request("PUT", "/queues/q", "not a map")).status == 400
    assert put_queue(router, "q", durable="yes").status == 400
    assert put_queue(router, "q", arguments=["x"]).status == 400


def test_amq_names_are_403_and_unsupported_types_501(router: Router) -> None:
    assert put_queue(router, "amq.mine").status == 403
    assert router.handle(Request("PUT", "/exchanges/amq.direct", {"type": "direct"})).status == 403
    assert router.handle(Request("DELETE", "/exchanges/amq.direct")).status == 403
    # Tanzu RabbitMQ's JMS queue type is not served.
    assert put_queue(router, "jms", arguments={"x-queue-type": "jms"}).status == 501


def test_message_counts_purge_and_delete(router: Router) -> None:
    put_queue(router, "work")
    queue = router.registry.queue("work")
    for index in range(5):
        queue.enqueue(Message(b"m%d" % index))
    assert body_map(router.handle(Request("GET", "/queues/work")))["message_count"] == 5
    purged = router.handle(Request("DELETE", "/queues/work/messages"))
    assert purged.status == 200
    assert purged.body == {"message_count": 5}
    assert type(body_map(purged)["message_count"]) is ULong
    queue.enqueue(Message(b"late"))
    deleted = router.handle(Request("DELETE", "/queues/work"))
    assert (deleted.status, deleted.body, deleted.deleted_queue) == (
        200,
        {"message_count": 1},
        "work",
    )
    assert router.handle(Request("GET", "/queues/work")).status == 404
    assert router.handle(Request("DELETE", "/queues/work/messages")).status == 404
    # RabbitMQ answers 200 for a queue that is already gone.
    gone = router.handle(Request("DELETE", "/queues/work"))
    assert (gone.status, gone.body, gone.deleted_queue) == (200, {"message_count": 0}, None)


def test_percent_encoded_names(router: Router) -> None:
    assert put_queue(router, "my%20queue%2Fä").status == 201
    assert router.registry.get("my queue/ä") is not None
    assert body_map(router.handle(Request("GET", "/queues/my%20queue%2F%C3%A4")))["name"] == (
        "my queue/ä"
    )


def test_exchanges_and_bindings(router: Router) -> None:
    put_queue(router, "logs")
    declare = {"type": "topic", "durable": True, "internal": False, "arguments": {}}
    assert router.handle(Request("PUT", "/exchanges/events", declare)).status == 204
    assert router.handle(Request("PUT", "/exchanges/events", declare)).status == 204
    other = {**declare, "type": "fanout"}
    assert router.handle(Request("PUT", "/exchanges/events", other)).status == 409
    info = body_map(router.handle(Request("GET", "/exchanges/events")))
    assert (info["type"], info["durable"], info["internal"]) == ("topic", True, False)
    bind = {
        "source": "events",
        "destination_queue": "logs",
        "binding_key": "app.*",
        "arguments": {},
    }
    assert router.handle(Request("POST", "/bindings", bind)).status == 204
    assert [q.name for q in router.registry.route("events", "app.start")] == ["logs"]
    listed = router.handle(Request("GET", "/bindings?src=events&dstq=logs&key=app.%2A"))
    assert listed.status == 200
    assert isinstance(listed.body, list)
    assert [b["binding_key"] for b in listed.body] == ["app.*"]
    path = "/bindings/src=events;dstq=logs;key=app.%2A;args="
    assert router.handle(Request("DELETE", path)).status == 204
    assert router.registry.route("events", "app.start") == []
    assert router.handle(Request("DELETE", "/exchanges/events")).status == 204
    assert router.handle(Request("GET", "/exchanges/events")).status == 404


def test_binding_errors(router: Router) -> None:
    put_queue(router, "q")
    missing = {"source": "nowhere", "destination_queue": "q", "binding_key": ""}
    assert router.handle(Request("POST", "/bindings", missing)).status == 404
    to_nowhere = {"source": "amq.direct", "destination_exchange": "nowhere", "binding_key": ""}
    assert router.handle(Request("POST", "/bindings", to_nowhere)).status == 404
    both = {"source": "amq.direct", "destination_queue": "q", "destination_exchange": "amq.topic"}
    assert router.handle(Request("POST", "/bindings", both)).status == 400
    to_default = {"source": "amq.direct", "destination_exchange": ""}
    assert router.handle(Request("POST", "/bindings", to_default)).status == 403
    assert router.handle(Request("POST", "/bindings", {"source": 1})).status == 400
    assert router.handle(Request("DELETE", "/bindings/src=amq.direct;key=")).status == 400
    bad_match = {"source": "amq.headers", "destination_queue": "q", "arguments": {"x-match": "one"}}
    assert router.handle(Request("POST", "/bindings", bad_match)).status == 409


def test_exchange_to_exchange_bindings(router: Router) -> None:
    put_queue(router, "q")
    put = {"type": "fanout", "durable": True, "auto_delete": False, "internal": True}
    assert router.handle(Request("PUT", "/exchanges/inner", put)).status == 204
    e2e = {"source": "amq.direct", "destination_exchange": "inner", "binding_key": "k"}
    assert router.handle(Request("POST", "/bindings", e2e)).status == 204
    to_queue = {"source": "inner", "destination_queue": "q"}
    assert router.handle(Request("POST", "/bindings", to_queue)).status == 204
    assert [q.name for q in router.registry.route("amq.direct", "k")] == ["q"]
    listed = router.handle(Request("GET", "/bindings?src=amq.direct&dste=inner&key=k"))
    assert listed.body == [
        {
            "source": "amq.direct",
            "vhost": "/",
            "destination": "inner",
            "destination_type": "exchange",
            "destination_exchange": "inner",
            "binding_key": "k",
            "arguments": {},
            "location": "/bindings/src=amq.direct;dste=inner;key=k;args=",
        }
    ]
    # A queue of the same name is another destination.
    assert router.handle(Request("GET", "/bindings?src=amq.direct&dstq=inner")).body == []
    path = "/bindings/src=amq.direct;dste=inner;key=k;args="
    assert router.handle(Request("DELETE", path)).status == 204
    assert router.registry.route("amq.direct", "k") == []
    assert router.handle(Request("GET", "/bindings?src=amq.direct&dste=inner")).body == []


def test_bindings_differing_by_arguments_are_deleted_by_their_location(router: Router) -> None:
    put_queue(router, "q")
    for colour in ("red", "blue"):
        body = {
            "source": "amq.headers",
            "destination_queue": "q",
            "binding_key": "",
            "arguments": {"x-match": "any", "colour": colour},
        }
        assert router.handle(Request("POST", "/bindings", body)).status == 204
    listed = router.handle(Request("GET", "/bindings?src=amq.headers&dstq=q&key="))
    assert isinstance(listed.body, list)
    by_colour = {b["arguments"]["colour"]: b["location"] for b in listed.body}
    assert set(by_colour) == {"red", "blue"}
    assert by_colour["red"] != by_colour["blue"]
    assert router.handle(Request("DELETE", by_colour["red"])).status == 204
    left = router.handle(Request("GET", "/bindings?src=amq.headers&dstq=q"))
    assert isinstance(left.body, list)
    assert [b["arguments"]["colour"] for b in left.body] == ["blue"]
    # A path whose arguments hash names no binding deletes nothing (RabbitMQ answers 204).
    wrong = "/bindings/src=amq.headers;dstq=q;key=;args="
    assert router.handle(Request("DELETE", wrong)).status == 204
    assert len(router.registry.bindings("amq.headers")) == 1


def test_listings(router: Router) -> None:
    put_queue(router, "b")
    put_queue(router, "a")
    listed = router.handle(Request("GET", "/queues"))
    assert listed.status == 200
    assert isinstance(listed.body, list)
    assert [q["name"] for q in listed.body] == ["a", "b"]
    exchanges = router.handle(Request("GET", "/exchanges"))
    assert isinstance(exchanges.body, list)
    assert {"amq.direct", "amq.fanout", "amq.topic"} <= {x["name"] for x in exchanges.body}


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nothing", 404),
        ("GET", "", 404),
        ("POST", "/queues/q", 405),
        ("PUT", "/queues/q/messages", 405),
        ("GET", "/queues/q/extra/deep", 404),
        ("PUT", "/bindings", 405),
        ("POST", "/exchanges", 405),
    ],
)
def test_unknown_paths_and_methods(router: Router, method: str, path: str, status: int) -> None:
    assert router.handle(Request(method, path)).status == status


class _Only:
    """Allows one access on names starting with a prefix, like a user's patterns."""

    def __init__(self, access: Access, prefix: str) -> None:
        self.access = access
        self.prefix = prefix

    def allows(self, access: Access, name: str, /) -> bool:
        return access == self.access and name.startswith(self.prefix)


def test_permissions_are_checked_per_request(router: Router) -> None:
    configure = Caller(permissions=_Only("configure", "app."))
    assert router.handle(Request("PUT", "/queues/app.q", {}), configure).status == 201
    refused = router.handle(Request("PUT", "/queues/other", {}), configure)
    assert refused.status == 403
    assert router.registry.get("other") is None
    # Purging needs read, which this caller lacks; reading the description needs one of the
    # three permissions (RabbitMQ's passive declaration).
    assert router.handle(Request("DELETE", "/queues/app.q/messages"), configure).status == 403
    assert router.handle(Request("GET", "/queues/app.q"), configure).status == 200
    assert router.handle(Request("GET", "/queues/app.q"), Caller(permissions=NOBODY)).status == 403
    assert router.handle(Request("DELETE", "/queues/app.q"), Caller(permissions=NOBODY)).status == (
        403
    )


class _Patterns:
    """Allows each access on names starting with its own prefix."""

    def __init__(self, **prefixes: str) -> None:
        self.prefixes = prefixes

    def allows(self, access: Access, name: str, /) -> bool:
        prefix = self.prefixes.get(access)
        return prefix is not None and name.startswith(prefix)


def test_binding_an_exchange_needs_read_on_the_source_and_write_on_the_destination(
    router: Router,
) -> None:
    for name in ("src.x", "dst.x", "other.x"):
        assert router.handle(Request("PUT", f"/exchanges/{name}", {"type": "fanout"})).status == 204
    caller = Caller(permissions=_Patterns(read="src.", write="dst."))

    def bind(source: str, destination: str) -> int:
        body = {"source": source, "destination_exchange": destination, "binding_key": ""}
        return router.handle(Request("POST", "/bindings", body), caller).status

    assert bind("src.x", "dst.x") == 204
    assert bind("src.x", "other.x") == 403
    assert bind("other.x", "dst.x") == 403
    refused = router.handle(
        Request("DELETE", "/bindings/src=other.x;dste=dst.x;key=;args="), caller
    )
    assert refused.status == 403
    path = "/bindings/src=src.x;dste=dst.x;key=;args="
    assert router.handle(Request("DELETE", path), caller).status == 204
    assert router.registry.bindings("src.x") == []


def test_an_exclusive_queue_belongs_to_its_connection(router: Router) -> None:
    """Another connection gets RabbitMQ's 400 "cannot obtain exclusive access" for each use."""
    mine, theirs = Caller(owner=object()), Caller(owner=object())
    body = {"exclusive": True, "durable": False}
    created = router.handle(Request("PUT", "/queues/excl", body), mine)
    assert (created.status, created.exclusive_queue) == (201, "excl")
    assert router.registry.owner("excl") is mine.owner
    assert router.handle(Request("PUT", "/queues/excl", body), mine).status == 200
    bind = {"source": "amq.direct", "destination_queue": "excl", "binding_key": "k"}
    for request in (
        Request("PUT", "/queues/excl", body),
        Request("PUT", "/queues/excl", {"exclusive": False, "durable": False}),
        Request("DELETE", "/queues/excl/messages"),
        Request("DELETE", "/queues/excl"),
        Request("POST", "/bindings", bind),
        Request("DELETE", "/bindings/src=amq.direct;dstq=excl;key=k;args="),
    ):
        refused = router.handle(request, theirs)
        assert refused.status == 400, request
        assert "cannot obtain exclusive access to locked queue 'excl'" in str(refused.body)
    # The owner itself cannot turn it into a shared queue either (RabbitMQ's 400 too).
    shared = {"exclusive": False, "durable": False}
    assert router.handle(Request("PUT", "/queues/excl", shared), mine).status == 400
    assert router.handle(Request("GET", "/queues/excl"), theirs).status == 200
    assert router.handle(Request("POST", "/bindings", bind), mine).status == 204
    assert router.handle(Request("DELETE", "/queues/excl"), mine).status == 200


def test_a_dead_letter_exchange_needs_write_where_dead_letters_go(router: Router) -> None:
    """RabbitMQ's check at declaration: *read* on the queue, *write* on its DLX."""
    put = router.handle(Request("PUT", "/exchanges/events", {"type": "fanout"}))
    assert put.status == 204
    limited = Caller(permissions=_Patterns(configure="mine", write="mine", read="mine"))

    def declare(name: str, arguments: Mapping[str, object], caller: Caller = limited) -> int:
        body = {"durable": False, "arguments": arguments}
        return router.handle(Request("PUT", f"/queues/{name}", body), caller).status

    # To the default exchange, the dead-letter routing key names the queue written to.
    dlx = {"x-dead-letter-exchange": ""}
    assert declare("mine-1", {**dlx, "x-dead-letter-routing-key": "secret"}) == 403
    assert declare("mine-2", {**dlx, "x-dead-letter-routing-key": "mine-dead"}) == 201
    # Without one, the message's own routing key decides: write on amq.default is needed.
    assert declare("mine-3", dlx) == 403
    # A named exchange needs write on it.
    assert declare("mine-4", {"x-dead-letter-exchange": "events"}) == 403
    assert declare("mine-5", {"x-dead-letter-exchange": "mine-x"}) == 201
    # And reading the queue: its dead letters are its messages.
    writer = Caller(permissions=_Patterns(configure="w", write=""))
    assert declare("w-1", {"x-dead-letter-exchange": "w-x"}, writer) == 403
    assert [q for q in ("mine-1", "mine-3", "mine-4", "w-1") if router.registry.get(q)] == []
    # A queue that exists keeps its arguments: a redeclaration cannot change them.
    changed = {**dlx, "x-dead-letter-routing-key": "secret"}
    assert declare("mine-2", changed) == 409


def test_an_alternate_exchange_needs_write_on_it(router: Router) -> None:
    caller = Caller(permissions=_Patterns(configure="x.", read="x.", write="ae."))

    def declare(name: str, alternate: str, who: Caller = caller) -> int:
        body = {"type": "direct", "arguments": {"alternate-exchange": alternate}}
        return router.handle(Request("PUT", f"/exchanges/{name}", body), who).status

    assert declare("x.1", "ae.1") == 204
    assert declare("x.2", "secret") == 403
    no_read = Caller(permissions=_Patterns(configure="x.", write="ae."))
    assert declare("x.3", "ae.1", no_read) == 403
    assert [x.name for x in router.registry.exchanges() if x.name.startswith("x.")] == ["x.1"]


def test_listings_show_what_the_caller_has_a_permission_on(router: Router) -> None:
    for name in ("app.q", "other.q"):
        put_queue(router, name)
    for name in ("app.x", "other.x"):
        router.handle(Request("PUT", f"/exchanges/{name}", {"type": "fanout"}))
    for exchange, queue in (("app.x", "app.q"), ("other.x", "app.q"), ("app.x", "other.q")):
        bind = {"source": exchange, "destination_queue": queue, "binding_key": ""}
        assert router.handle(Request("POST", "/bindings", bind)).status == 204
    caller = Caller(permissions=_Patterns(read="app.", write="app."))

    def names(path: str) -> list[str]:
        body = router.handle(Request("GET", path), caller).body
        assert isinstance(body, list)
        return [str(item.get("name", item.get("source"))) for item in body]

    assert names("/queues") == ["app.q"]
    assert names("/exchanges") == ["app.x"]
    # A binding shows with read on its source and write on its destination.
    assert names("/bindings") == ["app.x"]
    assert router.handle(Request("GET", "/exchanges/other.x"), caller).status == 403
    asked = router.handle(Request("GET", "/bindings?src=other.x&dstq=app.q"), caller)
    assert asked.status == 403
    assert names("/queues") == ["app.q"]
    nobody = router.handle(Request("GET", "/queues"), Caller(permissions=NOBODY))
    assert nobody.body == []


def test_virtual_host_limits_refuse_new_queues_exchanges_and_bindings_only() -> None:
    settings = VhostSettings("tenant", max_queues=1, max_exchanges=1, max_bindings=1)
    tenancy = Tenancy({"tenant": settings}, {"tenant": QueueRegistry()})
    vhost = tenancy.vhosts["tenant"]
    router = Router(vhost.registry, vhost="tenant", quotas=vhost)
    assert put_queue(router, "one").status == 201
    refused = put_queue(router, "two")
    assert (refused.status, refused.body) == (
        403,
        "cannot declare queue 'two': queue limit in vhost 'tenant' (1) is reached",
    )
    assert put_queue(router, "one").status == 200
    body = router.handle(Request("GET", "/queues/one")).body
    assert isinstance(body, dict)
    assert body["vhost"] == "tenant"

    def put_exchange(name: str) -> Response:
        return router.handle(Request("PUT", f"/exchanges/{name}", {"type": "fanout"}))

    # The server's own amq.* exchanges do not count.
    assert put_exchange("x").status == 204
    assert put_exchange("x").status == 204
    assert put_exchange("y").status == 403

    def bind(source: str, key: str) -> Response:
        body = {"source": source, "destination_queue": "one", "binding_key": key}
        return router.handle(Request("POST", "/bindings", body))

    assert bind("x", "a").status == 204
    assert bind("x", "a").status == 204  # the same binding again changes nothing
    refused = bind("amq.direct", "b")
    assert refused.status == 403
    assert "binding limit in vhost 'tenant' (1) is reached" in str(refused.body)
    # Deleting the queue takes its binding: there is room again.
    assert router.handle(Request("DELETE", "/queues/one")).status == 200
    assert vhost.registry.binding_count == 0
    assert put_queue(router, "one").status == 201
    assert bind("amq.direct", "b").status == 204


@pytest.mark.parametrize("name", ["a\nb", "a\rb", "a\x00b", "q" * 256, "\u00e9" * 128])
def test_names_with_line_breaks_or_nul_or_past_255_bytes_are_refused(
    router: Router, name: str
) -> None:
    assert put_queue(router, name).status == 400
    body = {"type": "fanout"}
    quoted = quote(name, safe="")
    assert router.handle(Request("PUT", f"/exchanges/{quoted}", body)).status == 400


def test_a_name_of_255_bytes_is_taken(router: Router) -> None:
    """RabbitMQ's limit is bytes, not characters: 127 two-byte characters and one more byte."""
    name = "\u00e9" * 127 + "q"
    assert put_queue(router, name).status == 201
    quoted = quote(name, safe="")
    assert router.handle(Request("PUT", f"/exchanges/{quoted}", {"type": "fanout"})).status == 204


def test_declaring_or_reading_a_queue_renews_its_x_expires_lease() -> None:
    """As RabbitMQ's ``stat``: the management's answers about a queue are use of it."""
    clock = Clock(1_000)
    registry = QueueRegistry(clock)
    router = Router(registry)
    put_queue(router, "leased", arguments={"x-expires": 300})
    clock.now = 1_200
    assert router.handle(Request("GET", "/queues/leased")).status == 200
    clock.now = 1_400
    assert put_queue(router, "leased", arguments={"x-expires": 300}).status == 200
    # Listing every queue is not use of each.
    clock.now = 1_699
    assert router.handle(Request("GET", "/queues")).status == 200
    assert registry.expire_unused() == []
    clock.now = 1_700
    assert registry.expire_unused() == ["leased"]
    assert router.handle(Request("GET", "/queues/leased")).status == 404


def test_exchange_arguments_rabbitmq_does_not_know_are_kept_and_listed(router: Router) -> None:
    declare = {"type": "x-local-random", "arguments": {"test": "kept"}}
    assert router.handle(Request("PUT", "/exchanges/spread", declare)).status == 204
    info = body_map(router.handle(Request("GET", "/exchanges/spread")))
    assert (info["type"], info["arguments"]) == ("x-local-random", {"test": "kept"})
    plugin = {"type": "x-consistent-hash"}
    assert router.handle(Request("PUT", "/exchanges/hashed", plugin)).status == 204
    assert body_map(router.handle(Request("GET", "/exchanges/hashed")))["type"] == plugin["type"]


def _names(page: dict[str, object]) -> list[object]:
    items = page["items"]
    assert isinstance(items, list)
    return [item["name"] for item in items]


def test_pages_as_rabbitmqs_http_api_has_them(router: Router) -> None:
    for n in range(7):
        put_queue(router, f"paged-{n}")
    first = body_map(router.handle(Request("GET", "/queues?page=1&page_size=3")))
    assert _names(first) == ["paged-0", "paged-1", "paged-2"]
    assert {key: value for key, value in first.items() if key != "items"} == {
        "page": 1,
        "page_size": 3,
        "page_count": 3,
        "item_count": 3,
        "total_count": 7,
        "filtered_count": 7,
    }
    last = body_map(router.handle(Request("GET", "/queues?page=3&page_size=3")))
    assert _names(last) == ["paged-6"]
    exchanges = body_map(router.handle(Request("GET", "/exchanges?page=1")))
    assert exchanges["page_size"] == 100
    for query, reason in [
        ("page=4&page_size=3", "page out of range"),
        ("page=0", "page must be at least 1"),
        ("page=1&page_size=501", "page_size 1 to 500"),
        ("page=x", "must be integers"),
    ]:
        refused = router.handle(Request("GET", f"/queues?{query}"))
        assert refused.status == 400, query
        assert reason in str(refused.body), query


def test_an_unpaged_listing_too_large_for_one_reply_says_to_page(router: Router) -> None:
    for n in range(MAX_UNPAGED + 1):
        router.registry.declare_queue(f"many-{n:05d}")
    refused = router.handle(Request("GET", "/queues"))
    assert refused.status == 400
    assert "?page=1&page_size=500" in str(refused.body)
    page = body_map(router.handle(Request("GET", "/queues?page=5&page_size=500")))
    assert page["item_count"] == 1


def test_a_streams_byte_range_is_summed_where_the_sizes_are_kept(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    put_queue(router, "events", arguments={"x-queue-type": "stream"})
    stream = router.registry.queue("events")
    assert isinstance(stream, StreamQueue)
    for index in range(10):
        stream.enqueue(Message(encode(Described(0x75, b"e" * (10 * index)))))
    sizes = list(stream.entries.sizes(0, 10))

    def byte_range(query: str, caller: Caller | None = None) -> Response:
        return router.handle(Request("GET", f"/queues/events/byte-range?{query}"), caller)

    # Offsets 2, 3 and 4 fit; 5 would go past the limit.
    limit = sum(sizes[2:5]) + sizes[5] - 1
    assert byte_range(f"start=2&stop=10&max_bytes={limit}").body == {
        "end": 5,
        "bytes": sum(sizes[2:5]),
        "capped": False,
    }
    assert byte_range("start=0&stop=99&max_bytes=999999").body == {
        "end": 10,
        "bytes": sum(sizes),
        "capped": False,
    }
    # A first message larger than the limit: none fits, or it alone when asked for.
    assert byte_range("start=3&stop=10&max_bytes=1").body == {"end": 3, "bytes": 0, "capped": False}
    alone = byte_range("start=3&stop=10&max_bytes=1&at_least_one=true")
    assert alone.body == {"end": 4, "bytes": sizes[3], "capped": False}
    assert byte_range("start=10&stop=12&max_bytes=5").body == {
        "end": 10,
        "bytes": 0,
        "capped": False,
    }
    monkeypatch.setattr(stream_module, "MAX_SIZES_PER_RANGE", 4)
    assert byte_range("start=1&stop=10&max_bytes=999999").body == {
        "end": 5,
        "bytes": sum(sizes[1:5]),
        "capped": True,
    }
    for query in ("start=1&stop=2", "start=a&stop=2&max_bytes=3", "start=-1&stop=2&max_bytes=3"):
        assert byte_range(query).status == 400
    put_queue(router, "work")
    classic = router.handle(Request("GET", "/queues/work/byte-range?start=0&stop=1&max_bytes=1"))
    assert classic.status == 400
    assert (
        byte_range("start=0&stop=1&max_bytes=1", Caller(permissions=_Patterns(configure=""))).status
        == 403
    )
    assert router.handle(Request("PUT", "/queues/events/byte-range?start=0")).status == 405
