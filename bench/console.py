"""The web console's figures (docs/console.md): its screenshots, and what it costs the server.

``python -m bench.console screenshots`` starts a server with an administrator, fills its memory
budget with a publisher nobody consumes, adds a consumer without credit, a publisher and a
consumer that keep messages flowing through ``events``, and a few dozen queues, and has headless
Chromium (Debian's, through Playwright) photograph the main pages into ``docs/img/console-*.png``.

``python -m bench.console cpu`` starts a server with 1,000 queues and 100 connections (each a
consumer of its own queue), reads the server process's CPU time from ``/proc`` over a minute
without a browser, then over a minute with the console open on each measured page.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

from playwright.sync_api import Page, sync_playwright
from proton import Event, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench.servers import free_port
from sluicegate.gateway.rules.auth import hash_password

CHROMIUM: Final = "/usr/bin/chromium"
USER: Final = "admin"
PASSWORD: Final = "console-demo"
IMAGES: Final = Path(__file__).resolve().parent.parent / "docs" / "img"
# The screenshots' server: a budget a publisher fills in a moment.
SCREENSHOT_BUDGET: Final = "8MiB"
# The load for the CPU figure, and how long each reading lasts.
QUEUES: Final = 1000
CONNECTIONS: Final = 100
MINUTE: Final = 60.0


@dataclass
class Running:
    """A server subprocess and where its AMQP port and console are."""

    process: subprocess.Popen[str]
    amqp: str
    http: str

    def call(self, method: str, path: str, body: object = None) -> Any:
        """One API request as the administrator; the decoded JSON body (None when empty)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.http + "/api" + path, data=data, method=method)
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text else None

    def cpu_seconds(self) -> float:
        """The process's user and system CPU time, from /proc."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rpartition(")")[2].split()
        ticks = os.sysconf("SC_CLK_TCK")
        return (int(fields[11]) + int(fields[12])) / ticks


@contextmanager
def serving(*options: str) -> Iterator[Running]:
    """``sluicegate serve`` with an administrator and ``options``, stopped by SIGTERM."""
    with tempfile.TemporaryDirectory(prefix="sluicegate-console-") as scratch:
        config = Path(scratch) / "sluicegate.toml"
        config.write_text(
            f'[users.{USER}]\npassword_hash = "{hash_password(PASSWORD)}"\n'
            'tags = ["administrator"]\nconfigure = ".*"\nwrite = ".*"\nread = ".*"\n'
        )
        http_port = free_port()
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "sluicegate", "serve", "--config", str(config)),
                *("--listen", "127.0.0.1:0", "--data-dir", scratch),
                *("--http-api-listen", f"127.0.0.1:{http_port}", *options),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            port = line.rstrip().rpartition(":")[2]
            if not port.isdigit():
                raise SystemExit(f"the server did not start: {line!r}")
            yield Running(
                process,
                f"amqp://{USER}:{PASSWORD}@127.0.0.1:{port}",
                f"http://127.0.0.1:{http_port}",
            )
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(30)


class _Clients(MessagingHandler):
    """Consumers (one connection each) and an unthrottled publisher, on one reactor."""

    def __init__(self, url: str, consumers: list[tuple[str, int]], publish_to: list[str]) -> None:
        super().__init__(prefetch=0, auto_accept=True)
        self.url = url
        self.consumers = list(consumers)
        self.publish_to = publish_to
        self.body = Message(body=b"x" * 4096)
        self.stopping = threading.Event()

    def on_start(self, event: Event) -> None:
        container = event.container
        assert container is not None
        for address in self.publish_to:
            container.create_sender(container.connect(self.url), address)
        self._next_consumer(container)
        container.schedule(0.2, self)

    def on_link_opened(self, event: Event) -> None:
        # One login at a time: the server's password checks are few (gateway/login.py).
        container = event.container
        assert container is not None
        if event.receiver is not None:
            self._next_consumer(container)

    def _next_consumer(self, container: Container) -> None:
        if self.consumers:
            address, credit = self.consumers.pop()
            receiver = container.create_receiver(container.connect(self.url), address)
            if credit:
                receiver.flow(credit)

    def on_timer_task(self, event: Event) -> None:
        container = event.container
        assert container is not None
        if self.stopping.is_set():
            container.stop()
        else:
            container.schedule(0.2, self)

    def on_message(self, event: Event) -> None:
        # A consumer with credit keeps it: one more for each message taken.
        receiver = event.receiver
        assert receiver is not None
        receiver.flow(1)

    def on_sendable(self, event: Event) -> None:
        sender = event.sender
        assert sender is not None
        while sender.credit > 0 and not self.stopping.is_set():
            sender.send(self.body)


@contextmanager
def clients(url: str, consumers: list[tuple[str, int]], publish_to: list[str]) -> Iterator[None]:
    handler = _Clients(url, consumers, publish_to)
    thread = threading.Thread(target=Container(handler).run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        handler.stopping.set()
        thread.join(10)


def wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("the scenario did not reach its state in time")
        time.sleep(0.1)


def log_in(page: Page, running: Running) -> None:
    page.goto(running.http + "/")
    page.fill("#username", USER)
    page.fill("#password", PASSWORD)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#totals .card")


def screenshots() -> None:
    """Photograph the main pages of a server whose budget a publisher holds."""
    with serving("--memory-budget", SCREENSHOT_BUDGET) as running:
        for i in range(30):
            running.call("PUT", f"/queues/%2F/shop.{i:02d}", {"durable": True})
        consumers = [("audit", 0), ("events", 50)]
        with clients(running.amqp, consumers, publish_to=["orders", "events"]):
            wait_for(lambda: running.call("GET", "/sluicegate/budget")["blocked"])
            publisher = next(
                c["connection"] for c in running.call("GET", "/sluicegate/budget")["paused"]
            )
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM)
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(running.http + "/")
                page.wait_for_selector("#login:not([hidden])")
                page.screenshot(path=IMAGES / "console-login.png")
                log_in(page, running)
                page.wait_for_timeout(8000)  # a few points on the charts
                page.screenshot(path=IMAGES / "console-overview.png", full_page=True)
                shots = {
                    "connections": "#/connections",
                    "connection": f"#/connection/{quote(publisher, safe='')}",
                    "queues": "#/queues",
                    "budget": "#/budget",
                }
                for name, fragment in shots.items():
                    page.goto(running.http + "/" + fragment)
                    page.wait_for_timeout(5000)
                    page.screenshot(path=IMAGES / f"console-{name}.png", full_page=True)
                consumer = next(
                    c["name"]
                    for c in running.call("GET", "/connections")
                    if any(link["queue"] == "audit" for link in _loops(running, c["name"]))
                )
                page.goto(running.http + f"/#/connection/{quote(consumer, safe='')}")
                page.wait_for_timeout(5000)
                page.screenshot(path=IMAGES / "console-consumer.png", full_page=True)
                browser.close()
    print(f"screenshots in {IMAGES}")


def _loops(running: Running, name: str) -> list[dict[str, Any]]:
    consumers: list[dict[str, Any]] = running.call(
        "GET", f"/sluicegate/connections/{quote(name, safe='')}"
    )["consumers"]
    return consumers


def cpu() -> None:
    """Server CPU over a minute without the console, then with it open on each page."""
    with serving() as running:
        for i in range(QUEUES):
            running.call("PUT", f"/queues/%2F/load-{i:04d}", {"durable": False})
        consumers = [(f"load-{i:04d}", 10) for i in range(CONNECTIONS)]
        with clients(running.amqp, consumers, publish_to=[]):
            wait_for(lambda: len(running.call("GET", "/connections")) == CONNECTIONS, 120.0)
            connection = running.call("GET", "/connections")[0]["name"]
            time.sleep(5)
            readings = {"no browser": _minute(running, None)}
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM)
                page = browser.new_page()
                log_in(page, running)
                for fragment in (
                    "#/overview",
                    "#/connections",
                    f"#/connection/{quote(connection, safe='')}",
                    "#/queues",
                    "#/budget",
                ):
                    readings[fragment.split("/")[1]] = _minute(running, (page, fragment))
                browser.close()
    for name, seconds in readings.items():
        print(f"{name:12} {seconds:6.2f} s of server CPU per minute ({seconds / MINUTE:.1%})")


def _minute(running: Running, open_page: tuple[Page, str] | None) -> float:
    if open_page is not None:
        page, fragment = open_page
        page.goto(running.http + "/" + fragment)
        page.wait_for_timeout(3000)
    before = running.cpu_seconds()
    time.sleep(MINUTE)
    return running.cpu_seconds() - before


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.console", description=__doc__)
    parser.add_argument("what", choices=("screenshots", "cpu"))
    arguments = parser.parse_args()
    screenshots() if arguments.what == "screenshots" else cpu()


if __name__ == "__main__":
    main()
