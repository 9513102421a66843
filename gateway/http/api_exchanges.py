"""RabbitMQ's ``/api/exchanges`` and ``/api/bindings`` (docs/http-api.md), through the vhost's
management router, in RabbitMQ's HTTP shapes (the default exchange, ``properties_key``).
"""

from __future__ import annotations

from urllib.parse import quote

from sluicegate.gateway.http.api_request import (
    Answer,
    ApiRequest,
    HttpRefused,
    json_object,
    response_map,
)
from sluicegate.gateway.rules.auth import DEFAULT_VHOST
from sluicegate.gateway.rules.tenancy import VirtualHost


def exchanges(job: ApiRequest, segments: list[str]) -> Answer:
    if len(segments) <= 1:
        return job.listing(segments, "exchanges", _exchange_shape)
    if len(segments) != 2:
        return Answer(404, "Not Found")
    vhost = job.vhost(segments[0])
    name = "" if segments[1] == "amq.default" else segments[1]
    path = "/exchanges/" + quote(name, safe="")
    job.allow("GET", "PUT", "DELETE")
    if job.method == "GET" and not name:
        # The default exchange: RabbitMQ's HTTP API shows it, the router has no map for it.
        return Answer(200, _default_exchange(vhost))
    if job.method == "GET":
        return Answer(200, _exchange_shape(vhost, response_map(job.route(vhost, "GET", path))))
    if job.method == "DELETE":
        job.route(vhost, "GET", path)  # 404 for none, as RabbitMQ answers
        job.route(vhost, "DELETE", path)
        return Answer(204)
    body = json_object(job.body)
    if "type" not in body:
        raise HttpRefused(400, "an exchange needs its 'type'")
    existed = _exists(job, vhost, path)
    declared = {
        k: body[k] for k in ("type", "durable", "auto_delete", "internal", "arguments") if k in body
    }
    job.route(vhost, "PUT", path, declared)
    return Answer(204 if existed else 201)


def _exists(job: ApiRequest, vhost: VirtualHost, path: str) -> bool:
    try:
        job.route(vhost, "GET", path)
    except HttpRefused as refused:
        if refused.status == 404:
            return False
        raise
    return True


def bindings(job: ApiRequest, segments: list[str]) -> Answer:
    if len(segments) <= 1:
        return job.listing(segments, "bindings", _binding_shape)
    if len(segments) not in (5, 6) or segments[1] != "e" or segments[3] not in ("q", "e"):
        return Answer(404, "Not Found")
    vhost = job.vhost(segments[0])
    source, destination = segments[2], segments[4]
    kind = "dstq" if segments[3] == "q" else "dste"
    ends = f"src={quote(source, safe='')}&{kind}={quote(destination, safe='')}"
    if len(segments) == 5:
        job.allow("GET", "POST")
        if job.method == "GET":
            listed = job.route(vhost, "GET", f"/bindings?{ends}").body
            assert isinstance(listed, list)
            return Answer(200, [_binding_shape(vhost, item) for item in listed])
        return _bind(job, vhost, source, destination, segments[3] == "e")
    job.allow("GET", "DELETE")
    listed = job.route(vhost, "GET", f"/bindings?{ends}").body
    assert isinstance(listed, list)
    found = next(
        (b for b in listed if _binding_shape(vhost, b)["properties_key"] == segments[5]), None
    )
    if found is None:
        return Answer(404, "Not Found")
    if job.method == "GET":
        return Answer(200, _binding_shape(vhost, found))
    job.route(vhost, "DELETE", str(found["location"]))
    return Answer(204)


def _bind(
    job: ApiRequest, vhost: VirtualHost, source: str, destination: str, to_exchange: bool
) -> Answer:
    body = json_object(job.body)
    key = body.get("routing_key", "")
    request = {
        "source": source,
        "destination_exchange" if to_exchange else "destination_queue": destination,
        "binding_key": key,
        "arguments": body.get("arguments") or {},
    }
    job.route(vhost, "POST", "/bindings", request)
    kind = "e" if to_exchange else "q"
    properties = quote(str(key), safe="") if isinstance(key, str) else ""
    location = (
        f"/api/bindings/{quote(vhost.name, safe='')}/e/{quote(source, safe='')}/{kind}/"
        f"{quote(destination, safe='')}/{properties}"
    )
    return Answer(201, None, {"Location": location})


def _default_exchange(vhost: VirtualHost) -> dict[str, object]:
    return {
        "name": "",
        "vhost": vhost.name,
        "type": "direct",
        "durable": True,
        "auto_delete": False,
        "internal": False,
        "arguments": {},
        "user_who_performed_action": "rmq-internal",
    }


def _exchange_shape(vhost: VirtualHost, item: dict[str, object]) -> dict[str, object]:
    return {**item, "user_who_performed_action": "rmq-internal"}


def _binding_shape(vhost: VirtualHost, item: dict[str, object]) -> dict[str, object]:
    """The router's binding map in RabbitMQ's HTTP shape: ``routing_key`` and
    ``properties_key`` (the key, and ``~`` and the arguments' hash when it has arguments)."""
    location = str(item["location"])
    args_hash = location.rpartition(";args=")[2]
    key = str(item["binding_key"])
    properties = quote(key, safe="") + (f"~{args_hash}" if args_hash else "")
    return {
        "source": item["source"],
        "vhost": vhost.name if vhost.name else DEFAULT_VHOST,
        "destination": item["destination"],
        "destination_type": item["destination_type"],
        "routing_key": key,
        "arguments": item["arguments"],
        "properties_key": properties,
    }
