"""The web console in a real browser: Debian's headless Chromium, driven by Playwright, against a
real server with users, real AMQP clients and a small memory budget (docs/console.md).

One browser for the module; each test opens a fresh page (its own session storage, so its own
login). Chromium missing fails the module with how to install it: the console is not tested
without a browser.
"""

from __future__ import annotations

import base64
import functools
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from integration.conftest import RunningServer, start_server
from playwright.sync_api import Browser, Page, expect, sync_playwright
from proton.utils import BlockingConnection
from support.flood import Flood
from support.polling import wait_until
from support.raw_client import RawClient

from sluicegate.gateway.rules.auth import User, hash_password, parse_users
from sluicegate.gateway.rules.vhosts import parse_vhosts

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "s3cret"
EVERYTHING = {"configure": ".*", "write": ".*", "read": ".*"}
# A budget a flood fills in a moment, so that its publisher is held.
BUDGET = 2 * 1024 * 1024
# Milliseconds the browser waits for what a test expects: refreshes come every 2 s.
EXPECT_TIMEOUT = 20_000


@functools.cache
def _users() -> dict[str, User]:
    hashed = hash_password(PASSWORD)
    return parse_users(
        {
            "root": {
                "password_hash": hashed,
                "tags": ["administrator"],
                "permissions": dict.fromkeys(("/", "tenant-b", "paged"), EVERYTHING),
            },
            "alice": {"password_hash": hashed, "permissions": {"/": EVERYTHING}},
            "bob": {"password_hash": hashed, "permissions": {"tenant-b": EVERYTHING}},
        }
    )


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    running = start_server(
        users=_users(), vhosts=parse_vhosts({"tenant-b": {}, "paged": {}}), memory_budget=BUDGET
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    expect.set_options(timeout=EXPECT_TIMEOUT)
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield launched
        launched.close()


@pytest.fixture
def open_page(browser: Browser) -> Iterator[Callable[[], Page]]:
    """Fresh pages (each its own context: its own session storage); closed after the test."""
    contexts = []

    def open_() -> Page:
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(EXPECT_TIMEOUT)
        return page

    yield open_
    for context in contexts:
        context.close()


def console_url(running: RunningServer) -> str:
    return f"http://127.0.0.1:{running.server.http_api_port}/"


def log_in(page: Page, running: RunningServer, user: str, password: str = PASSWORD) -> None:
    page.goto(console_url(running))
    page.fill("#username", user)
    page.fill("#password", password)
    page.click("#login button[type=submit]")


def call(running: RunningServer, method: str, path: str, body: object = None) -> Any:
    """One API request as root; its decoded JSON body (None when empty)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(running.api_url + path, data=data, method=method)
    token = base64.b64encode(f"root:{PASSWORD}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


def _connections(running: RunningServer) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = call(running, "GET", "/connections")
    return listed


def _amqp_url(running: RunningServer, user: str) -> str:
    return f"amqp://{user}:{PASSWORD}@127.0.0.1:{running.port}"


def test_login_refuses_a_wrong_password_and_shows_the_overview(
    server: RunningServer, open_page: Callable[[], Page]
) -> None:
    """A wrong password stays on the login form with the API's reason; the right one shows
    the overview with its counts and its live charts, and the user and tags in the header."""
    page = open_page()
    log_in(page, server, "root", "wrong")
    expect(page.locator("#login-error")).to_have_text("Login failed")
    expect(page.locator("#nav")).to_be_hidden()
    page.fill("#password", PASSWORD)
    page.click("#login button[type=submit]")
    expect(page.locator("#who")).to_have_text("root (administrator)")
    expect(page.locator("#totals")).to_contain_text("connections")
    expect(page.locator("#budget-bar")).to_contain_text("of 2.0 MiB")
    expect(page.locator("#totals")).to_contain_text("resident memory")
    # Two charts (rates and the budget), drawn by uPlot from the vendored module.
    expect(page.locator(".uplot")).to_have_count(2)


def test_a_publisher_held_by_the_budget_shows_why_and_a_purge_lets_it_go(
    server: RunningServer, open_page: Callable[[], Page]
) -> None:
    """A flood to a queue nobody consumes fills the 2 MiB budget: its connection is listed as
    blocked, its page says its reads are paused by the memory budget and its publisher is held
    by it, and the budget page names its queue and it. Purged from the queues page, the queue
    gives the budget back: the flood's last outcomes arrive and the budget is no longer blocked."""
    flood = Flood(_amqp_url(server, "alice"), ["held-q"], body_size=4096)
    flood.start()
    try:
        wait_until(lambda: server.call(lambda: server.server.broker.publishing.budget.blocked))
        name = next(c["name"] for c in call(server, "GET", "/connections") if c["user"] == "alice")
        page = open_page()
        log_in(page, server, "root")
        page.click("text=Connections")
        row = page.locator("#connections tr", has_text=name)
        expect(row).to_contain_text("blocked")
        row.locator("a").click()
        expect(page.locator("#paused-because")).to_contain_text("memory budget")
        expect(page.locator("#publishers")).to_contain_text("held-q")
        expect(page.locator("#publishers .held")).to_contain_text("memory budget")
        page.click("text=Memory budget")
        expect(page.locator("#budget-queues")).to_contain_text("held-q")
        expect(page.locator("#budget-paused")).to_contain_text(name)
        held = call(server, "GET", "/queues/%2F/held-q")["messages_ready"]
        assert held * 4096 >= BUDGET // 2
        flood.stopping.set()
        page.click("#nav >> text=Queues")
        page.locator("#queues tr", has_text="held-q").get_by_role("button", name="Purge").click()
        flood.stop()
    finally:
        if flood.is_alive():
            flood.stopping.set()
            call(server, "DELETE", "/queues/%2F/held-q/contents")
            flood.stop()
    assert not server.call(lambda: server.server.broker.publishing.budget.blocked)
    assert call(server, "GET", "/queues/%2F/held-q")["messages_ready"] < held
    assert flood.error is None


def test_close_a_connection(server: RunningServer, open_page: Callable[[], Page]) -> None:
    """Close on the connections page: the client gets CLOSE with connection-forced and the
    row goes."""
    plain = ("alice", PASSWORD)
    with RawClient.connect(
        "127.0.0.1", server.port, plain=plain, container_id="to-close"
    ) as client:
        wait_until(lambda: any(c["container_id"] == "to-close" for c in _connections(server)))
        page = open_page()
        log_in(page, server, "root")
        page.goto(console_url(server) + "#/connections")
        row = page.locator("#connections tr", has_text="to-close")
        row.get_by_role("button", name="Close").click()
        close = client.wait_for("close", timeout=10)
        expect(row).to_have_count(0)
    assert close["error"]["condition"] == "amqp:connection:forced"
    assert all(c["container_id"] != "to-close" for c in _connections(server))


def test_a_user_sees_only_its_vhosts(server: RunningServer, open_page: Callable[[], Page]) -> None:
    """bob (tenant-b only) picks among his vhosts only, adds and deletes a queue there, and
    sees only his connections, his vhost's exchanges and bindings, and himself among users."""
    call(server, "PUT", "/queues/tenant-b/bobs-queue", {"durable": True})
    call(
        server, "POST", "/bindings/tenant-b/e/amq.direct/q/bobs-queue", {"routing_key": "bobs-key"}
    )
    alice = BlockingConnection(_amqp_url(server, "alice"))
    try:
        page = open_page()
        log_in(page, server, "bob")
        expect(page.locator("#who")).to_have_text("bob (management)")
        page.goto(console_url(server) + "#/queues")
        expect(page.locator("#vhost option")).to_have_text(["tenant-b"])
        expect(page.locator("#queues")).to_contain_text("bobs-queue")
        page.fill("#new-queue", "bobs-new")
        page.select_option("#new-queue-type", "quorum")
        page.get_by_role("button", name="Add").click()
        added = page.locator("#queues tr", has_text="bobs-new")
        expect(added).to_contain_text("quorum")
        assert call(server, "GET", "/queues/tenant-b/bobs-new")["type"] == "quorum"
        added.get_by_role("button", name="Delete").click()
        expect(added).to_have_count(0)
        with pytest.raises(urllib.error.HTTPError, match="404"):
            call(server, "GET", "/queues/tenant-b/bobs-new")
        page.goto(console_url(server) + "#/connections")
        expect(page.locator("#connections tbody tr")).to_have_count(0)
        page.goto(console_url(server) + "#/vhosts")
        expect(page.locator("#vhosts tbody tr")).to_have_count(1)
        page.goto(console_url(server) + "#/exchanges")
        expect(page.locator("#exchanges")).to_contain_text("amq.topic")
        expect(page.locator("#bindings")).to_contain_text("bobs-key")
        page.goto(console_url(server) + "#/users")
        expect(page.locator("#users tbody td:first-child")).to_have_text(["bob"])
        expect(page.locator("#permissions tbody tr")).to_have_count(1)
    finally:
        alice.close()


@pytest.mark.slow
def test_a_thousand_queues_page(server: RunningServer, open_page: Callable[[], Page]) -> None:
    """1,210 queues in a vhost: the queues page shows 50 at a time and pages through them in
    the API's order."""
    vhost = "paged"
    for i in range(1210):
        call(server, "PUT", f"/queues/{vhost}/many-{i:04d}", {"durable": False})
    page = open_page()
    log_in(page, server, "root")
    page.goto(console_url(server) + f"#/queues?vhost={vhost}")
    rows = page.locator("#queues tbody tr")
    expect(rows).to_have_count(50)
    expect(page.locator(".pager")).to_contain_text("page 1 of 25 (1210)")
    page.click(".pager >> text=next")
    expect(page.locator(".pager")).to_contain_text("page 2 of 25")
    second = call(server, "GET", f"/queues/{vhost}?page=2&page_size=50")["items"]
    expect(rows.first).to_contain_text(second[0]["name"])
    expect(rows).to_have_count(50)


def test_publish_a_message_from_the_queues_page_and_get_it_back(
    server: RunningServer, open_page: Callable[[], Page]
) -> None:
    """The queues page's form publishes through the default exchange to the named queue: the
    form says it was routed; a queue that does not exist gets "not routed" and is not created.
    The get form shows the message and leaves it (requeue), then takes it (ack_requeue_false);
    an AMQP consumer then finds the queue empty."""
    call(server, "PUT", "/queues/%2F/form-q", {})
    page = open_page()
    log_in(page, server, "alice")
    page.goto(console_url(server) + "#/queues")
    page.fill("#publish-queue", "form-q")
    page.fill("#publish-payload", "from the form")
    page.click("#publish button[type=submit]")
    expect(page.locator("#publish-result")).to_have_text("Message published.")
    page.fill("#publish-queue", "form-nowhere")
    page.click("#publish button[type=submit]")
    expect(page.locator("#publish-result")).to_have_text("Message published, but not routed.")
    page.fill("#get-queue", "form-q")
    page.click("#get button[type=submit]")
    expect(page.locator("#got")).to_contain_text("from the form")
    expect(page.locator("#got")).to_contain_text('{"delivery_mode":1}')
    assert call(server, "GET", "/queues/%2F/form-q")["messages_ready"] == 1
    page.select_option("#get-ackmode", "ack_requeue_false")
    page.click("#get button[type=submit]")
    wait_until(lambda: call(server, "GET", "/queues/%2F/form-q")["messages_ready"] == 0)
    page.click("#get button[type=submit]")
    expect(page.locator("#get-results p")).to_have_text("Queue is empty.")
    assert all(q["name"] != "form-nowhere" for q in call(server, "GET", "/queues/%2F"))
