"""The HTTP API's steps come from a generator of their own, slipped in between the others
(docs/adversary.md): a seed's other steps are those it drew before, saved breaches replay the
same, and every request the steps name is a well-formed HTTP request unless meant otherwise."""

from __future__ import annotations

from http.client import parse_headers
from io import BytesIO

from support.adversary.http_requests import requests_of
from support.adversary.steps import (
    DEFAULT_WEIGHTS,
    HTTP_ACTION,
    HTTP_REQUESTS,
    generate,
    weights_from,
)

STEPS = 3_000


def test_http_steps_are_slipped_in_and_change_no_other_draw() -> None:
    drawn = generate(67000, STEPS, DEFAULT_WEIGHTS)
    without = generate(67000, STEPS, weights_from(without=[HTTP_ACTION]))
    others = [s for s in drawn if s.action != HTTP_ACTION]
    assert others == without[: len(others)]
    http = [s for s in drawn if s.action == HTTP_ACTION]
    share = DEFAULT_WEIGHTS[HTTP_ACTION] / sum(DEFAULT_WEIGHTS.values())
    # A binomial draw of STEPS at ``share``: well within four standard deviations of it.
    assert abs(len(http) - share * STEPS) < 4 * (share * STEPS) ** 0.5
    assert {s.params["request"] for s in http} == set(HTTP_REQUESTS)


def test_only_http_steps_when_only_they_are_chosen() -> None:
    drawn = generate(67001, 200, weights_from(only=[HTTP_ACTION]))
    assert {s.action for s in drawn} == {HTTP_ACTION}


def test_every_request_but_the_bad_ones_is_well_formed_http() -> None:
    for step in generate(67002, STEPS, weights_from(only=[HTTP_ACTION])):
        requests = requests_of(step.params)
        assert len(requests) == step.params["repeat"]
        head, _, body = requests[0].partition(b"\r\n\r\n")
        method, path, version = head.split(b"\r\n")[0].split(b" ")
        assert version == b"HTTP/1.1"
        if step.params["request"] == "bad":
            continue
        assert method in (b"GET", b"PUT", b"POST", b"DELETE")
        assert path.startswith(b"/api/")
        headers = parse_headers(BytesIO(head.partition(b"\r\n")[2] + b"\r\n\r\n"))
        assert int(headers["Content-Length"]) == len(body)
