"""The durable queues, exchanges and bindings as the log knows them, and their records.

Each declaration is logged when it changes, and every segment starts with a snapshot of all of
them (:meth:`LoggedTopology.snapshot`), so that compaction may delete the segment that declared
something. Declaration records are built here with keyword fields, so that a field every record
gains later (a vhost) is added in one place.
"""

from __future__ import annotations

from sluicegate.queues.log.records import (
    Arguments,
    encode_binding,
    encode_exchange_declared,
    encode_exchange_deleted,
    encode_queue_declared,
    encode_queue_deleted,
    encode_stream_offset,
)
from sluicegate.queues.log.recovery import (
    BindingKey,
    ExchangeState,
    RecoveredState,
    without_exchange,
    without_queue,
)


class LoggedTopology:
    """What is declared; each method returns the record to log, or None if nothing changed."""

    def __init__(self, recovered: RecoveredState) -> None:
        self.queues: dict[str, Arguments] = dict(recovered.queues)
        self.exchanges: dict[str, ExchangeState] = dict(recovered.exchanges)
        self.bindings: dict[BindingKey, Arguments] = dict(recovered.bindings)
        self.stream_offsets: dict[str, int] = dict(recovered.stream_offsets)

    def declare_queue(self, name: str, arguments: Arguments) -> bytes | None:
        """A durable queue (again, if its arguments changed)."""
        if name in self.queues and self.queues[name] == arguments:
            return None
        self.queues[name] = arguments
        return encode_queue_declared(name, arguments)

    def delete_queue(self, name: str) -> bytes:
        """A queue's deletion, and so its bindings'."""
        self.queues.pop(name, None)
        self.stream_offsets.pop(name, None)
        without_queue(self.bindings, name)
        return encode_queue_deleted(name)

    def stream_emptied(self, name: str, offset: int) -> bytes | None:
        """A durable stream holds no message: its next one gets ``offset``. Kept in every
        segment's snapshot, since the segments of its messages may all be compacted away."""
        if name not in self.queues or self.stream_offsets.get(name) == offset:
            return None
        self.stream_offsets[name] = offset
        return encode_stream_offset(name, offset)

    def declare_exchange(self, name: str, exchange: ExchangeState) -> bytes | None:
        """A durable exchange with everything its declaration fixes."""
        if self.exchanges.get(name) == exchange:
            return None
        self.exchanges[name] = exchange
        return _exchange_record(name, exchange)

    def delete_exchange(self, name: str) -> bytes:
        """An exchange's deletion, and so its bindings'."""
        self.exchanges.pop(name, None)
        without_exchange(self.bindings, name)
        return encode_exchange_deleted(name)

    def bind(self, key: BindingKey, arguments: Arguments) -> bytes | None:
        """A binding (``key.to_exchange``: to an exchange)."""
        if key in self.bindings:
            return None
        self.bindings[key] = arguments
        return _binding_record(key, arguments, True)

    def unbind(self, key: BindingKey) -> bytes | None:
        """A binding's removal."""
        arguments = self.bindings.pop(key, None)
        return None if arguments is None else _binding_record(key, arguments, False)

    def snapshot(self) -> list[bytes]:
        """Records that declare everything that exists, exchanges first."""
        records = [_exchange_record(name, e) for name, e in self.exchanges.items()]
        records += [encode_queue_declared(name, args) for name, args in self.queues.items()]
        records += [encode_stream_offset(name, at) for name, at in self.stream_offsets.items()]
        records += [_binding_record(k, arguments, True) for k, arguments in self.bindings.items()]
        return records


def _exchange_record(name: str, exchange: ExchangeState) -> bytes:
    return encode_exchange_declared(
        name,
        exchange.kind,
        exchange.arguments,
        auto_delete=exchange.auto_delete,
        internal=exchange.internal,
    )


def _binding_record(key: BindingKey, arguments: Arguments, bound: bool) -> bytes:
    return encode_binding(
        key.exchange, key.destination, key.key, arguments, bound, to_exchange=key.to_exchange
    )
