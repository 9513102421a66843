"""Accepted means kept: issue 18's three scenarios, each against a real server process.

Run from the repository root (``--root DIR`` runs the server of another checkout, e.g. an older
commit unpacked with ``git archive``, for the figures before a change)::

    python bench/kept.py poison   # a victim's 20,000 persistent messages vs 87 poison ones
    python bench/kept.py damage   # 20,000 confirmed messages, one fault per copy of the log
    python bench/kept.py fanout   # fanout to 1,000 durable queues, 5 x 1 MiB persistent

Each prints what was lost, how many lines the server logged, the bytes its log grew by and how
long it took.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from proton import Event, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from sluicegate.clients.management import ManagementClient

MiB = 1024 * 1024
# A list nested deeper than the codec decodes (64): valid AMQP, refused or mishandled later.
_POISON_DEPTH = 70


class Server:
    """``python -m sluicegate serve`` in ``root``, its stderr collected."""

    def __init__(self, root: Path, data_dir: Path, *options: str) -> None:
        command = [sys.executable, "-m", "sluicegate", "serve", "--listen", "127.0.0.1:0"]
        command += ["--metrics-listen", "off", "--http-api-listen", "off"]
        command += ["--data-dir", str(data_dir), *options]
        self.process = subprocess.Popen(
            command, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.port = int(line.rsplit(":", 1)[1]) if "listening" in line else 0
        self.stderr: list[str] = []
        assert self.process.stderr is not None
        self._reader = threading.Thread(
            target=lambda: self.stderr.extend(self.process.stderr or ()), daemon=True
        )
        self._reader.start()

    @property
    def url(self) -> str:
        return f"amqp://127.0.0.1:{self.port}"

    def stop(self) -> int:
        """SIGTERM, wait; the exit status."""
        if self.process.poll() is None:
            self.process.terminate()
        status = self.process.wait(120)
        self._reader.join(5)
        return status


class _Publish(MessagingHandler):
    def __init__(self, url: str, address: str, messages: list[Message]) -> None:
        super().__init__(auto_settle=True)
        self.url, self.address, self.messages = url, address, messages
        self.sent = 0
        self.outcomes: dict[str, int] = {}

    def on_start(self, event: Event) -> None:
        assert event.container is not None
        event.container.create_sender(event.container.connect(self.url), self.address)

    def on_sendable(self, event: Event) -> None:
        assert event.sender is not None
        while event.sender.credit and self.sent < len(self.messages):
            event.sender.send(self.messages[self.sent])
            self.sent += 1

    def _outcome(self, event: Event, name: str) -> None:
        self.outcomes[name] = self.outcomes.get(name, 0) + 1
        if sum(self.outcomes.values()) == len(self.messages):
            assert event.connection is not None
            event.connection.close()

    def on_accepted(self, event: Event) -> None:
        self._outcome(event, "accepted")

    def on_rejected(self, event: Event) -> None:
        self._outcome(event, "rejected")

    def on_released(self, event: Event) -> None:
        self._outcome(event, "released")


def publish(url: str, address: str, messages: list[Message]) -> dict[str, int]:
    """Send ``messages``; the count of each outcome."""
    handler = _Publish(url, address, messages)
    Container(handler).run()
    return handler.outcomes


class _Drain(MessagingHandler):
    def __init__(self, url: str, addresses: list[str], idle: float) -> None:
        super().__init__(prefetch=500)
        self.url, self.addresses, self.idle = url, addresses, idle
        self.bodies: list[object] = []
        self.last = time.monotonic()

    def on_start(self, event: Event) -> None:
        assert event.container is not None
        connection = event.container.connect(self.url)
        for address in self.addresses:
            event.container.create_receiver(connection, address)
        event.container.schedule(self.idle, self)

    def on_timer_task(self, event: Event) -> None:
        assert event.container is not None
        if time.monotonic() - self.last >= self.idle:
            event.container.stop()
        else:
            event.container.schedule(self.idle, self)

    def on_message(self, event: Event) -> None:
        assert event.message is not None
        self.bodies.append(event.message.body)
        self.last = time.monotonic()


def drain(url: str, addresses: list[str], idle: float = 3.0) -> list[object]:
    """Every message of ``addresses`` (accepted), until none came for ``idle`` seconds."""
    handler = _Drain(url, addresses, idle)
    Container(handler).run()
    return handler.bodies


def _log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "log").glob("*.seg"))


def _report(name: str, lost: int, lines: list[str], written: int, seconds: float) -> None:
    print(
        f"{name}: lost {lost}, server log lines {len(lines)}, "
        f"log bytes {written / MiB:.1f} MiB, {seconds:.1f} s"
    )
    for line in lines[:40]:
        print(f"    | {line.rstrip()[:160]}")


def poison(root: Path, count: int, attacks: int) -> None:
    """A victim's persistent messages overflow (x-max-length 1, drop-head) into its dead-letter
    queue while an attacker's poison messages overflow into theirs, dead letters of both in the
    same batches; count the victim's messages after a restart."""
    data_dir = Path(tempfile.mkdtemp(prefix="sluicegate-kept-"))
    config = data_dir / "config.toml"
    config.write_text(
        "".join(
            f'[[queues]]\nname = "{q}"\narguments = {{ "x-max-length" = 1, '
            f'"x-dead-letter-exchange" = "{q}-dlx" }}\n[[queues]]\nname = "{q}-dead"\n'
            f'[[exchanges]]\nname = "{q}-dlx"\ntype = "fanout"\n'
            f'[[bindings]]\nsource = "{q}-dlx"\ndestination = "{q}-dead"\n'
            for q in ("attacker", "victim")
        )
    )
    server = Server(root, data_dir, "--config", str(config))
    started = time.monotonic()
    victim = [Message(body=f"v{i}", durable=True) for i in range(count)]
    deep: object = "poison"
    for _ in range(_POISON_DEPTH):
        deep = [deep]
    attack = [Message(body="p", durable=True, properties={"deep": deep}) for _ in range(attacks)]
    results: dict[str, dict[str, int]] = {}
    threads = [
        threading.Thread(
            target=lambda: results.update(a=publish(server.url, "/queues/attacker", attack))
        ),
        threading.Thread(
            target=lambda: results.update(v=publish(server.url, "/queues/victim", victim))
        ),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    server.stop()
    lines = list(server.stderr)
    server = Server(root, data_dir, "--config", str(config))
    bodies = drain(server.url, ["/queues/victim", "/queues/victim-dead"])
    server.stop()
    lines += server.stderr
    kept = len({b for b in bodies if isinstance(b, str) and b.startswith("v")})
    accepted = results["v"].get("accepted", 0)
    print(f"poison: victim accepted {accepted}/{count}, attacker {results['a']}")
    _report("poison", accepted - kept, lines, _log_bytes(data_dir), time.monotonic() - started)
    shutil.rmtree(data_dir, ignore_errors=True)


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


_FAULTS: dict[str, Callable[[list[Path]], object]] = {
    "middle segment deleted": lambda s: s[len(s) // 2].unlink(),
    "bit flip mid last segment": lambda s: _flip_middle(s[-1]),
    "last segment emptied": lambda s: s[-1].write_bytes(b""),
    "last segment deleted": lambda s: s[-1].unlink(),
    "bit flip in an earlier segment": lambda s: _flip_middle(s[len(s) // 3]),
}


def damage(root: Path, count: int) -> None:
    """Write ``count`` confirmed 1 KiB messages in 1 MiB segments, stop cleanly; then start on
    a copy of the data with each fault and count what comes back."""
    original = Path(tempfile.mkdtemp(prefix="sluicegate-kept-"))
    options = ("--log-segment-size", str(MiB))
    server = Server(root, original, *options)
    messages = [Message(body=f"m{i}-" + "x" * 1000, durable=True) for i in range(count)]
    accepted = publish(server.url, "/queues/kept", messages).get("accepted", 0)
    server.stop()
    print(f"damage: {accepted} confirmed, {len(list((original / 'log').glob('*.seg')))} segments")
    for name, fault in _FAULTS.items():
        copy = Path(tempfile.mkdtemp(prefix="sluicegate-kept-")) / "data"
        shutil.copytree(original, copy)
        fault(sorted((copy / "log").glob("*.seg")))
        started = time.monotonic()
        server = Server(root, copy, *options)
        if not server.port:
            server.stop()
            print(f"  {name}: refused to start in {time.monotonic() - started:.1f} s:")
            print(f"    | {''.join(server.stderr).strip()[:300]}")
        else:
            kept = len(drain(server.url, ["/queues/kept"], idle=2.0))
            server.stop()
            _report(f"  {name}", accepted - kept, server.stderr, 0, time.monotonic() - started)
        shutil.rmtree(copy.parent, ignore_errors=True)
    shutil.rmtree(original, ignore_errors=True)


class _Prober(threading.Thread):
    """Publishes a small message every 50 ms on its own connection; keeps the worst wait."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.worst = 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            started = time.monotonic()
            publish(self.url, "/queues/probe", [Message(body="probe")])
            self.worst = max(self.worst, time.monotonic() - started)
            time.sleep(0.05)


def fanout(root: Path, queues: int, count: int, size: int) -> None:
    """``count`` persistent messages of ``size`` bytes to a fanout bound to ``queues`` durable
    queues: the log bytes written, the time to confirm, a prober's worst wait, the copies
    recovered after a restart."""
    data_dir = Path(tempfile.mkdtemp(prefix="sluicegate-kept-"))
    config = data_dir / "config.toml"
    config.write_text(
        '[[exchanges]]\nname = "fan"\ntype = "fanout"\n'
        + "".join(f'[[queues]]\nname = "q{i}"\n' for i in range(queues))
        + "".join(f'[[bindings]]\nsource = "fan"\ndestination = "q{i}"\n' for i in range(queues))
    )
    options = ("--config", str(config), "--max-message-size", str(2 * size))
    server = Server(root, data_dir, *options)
    before = _log_bytes(data_dir)
    prober = _Prober(server.url)
    prober.start()
    started = time.monotonic()
    body = b"x" * size
    outcomes = publish(server.url, "/exchanges/fan", [Message(body=body, durable=True)] * count)
    elapsed = time.monotonic() - started
    prober.done.set()
    prober.join()
    written = _log_bytes(data_dir) - before
    server.stop()
    lines = list(server.stderr)
    server = Server(root, data_dir, *options)
    with ManagementClient(server.url) as client:
        listed = client.request("GET", "/queues").body
    assert isinstance(listed, list)
    copies = sum(
        int(q.get("message_count", 0))
        for q in listed
        if isinstance(q, dict) and str(q.get("name", "")).startswith("q")
    )
    server.stop()
    print(f"fanout: {outcomes}, {copies} copies recovered of {queues * count}")
    print(f"  prober's worst publish round trip {prober.worst:.2f} s")
    _report("fanout", queues * count - copies, lines, written, elapsed)
    shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenario", choices=["poison", "damage", "fanout"])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="checkout to serve from")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--attacks", type=int, default=87)
    parser.add_argument("--queues", type=int, default=1000)
    args = parser.parse_args()
    if args.scenario == "poison":
        poison(args.root, args.count, args.attacks)
    elif args.scenario == "damage":
        damage(args.root, args.count)
    else:
        fanout(args.root, args.queues, 5, MiB)


if __name__ == "__main__":
    main()
