"""Proton's reactor with a short path for the one event that comes with every message.

Proton's ``Reactor.process`` wraps every C event in a Python ``Event`` (looking up its context,
record and handler) and dispatches it twice, to the handler and to the global IO handler, each
time through ``getattr``. A message end to end costs three ``PN_DELIVERY`` events (counted with
quiver), and that plumbing was about half the server's CPU (``docs/performance.md``).
Deliveries concern only the broker, never the IO handler, so they go straight from the
collector to :meth:`Settling.on_delivery_of` (gateway/settling.py) as proton's bare
``pn_delivery_t`` (see ``gateway/proton/deliveries.py``); every other event takes proton's own path
unchanged, after the broker has applied the consumers' settlements gathered from the
deliveries before it (``gateway/proton/settlement_run.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, cast

from cproton import (
    PN_DELIVERY,
    PN_EVENT_NONE,
    ffi,
    pn_collector_peek,
    pn_collector_pop,
    pn_event_delivery,
    pn_event_type,
)
from proton import Event, Handler
from proton.reactor import Container

from sluicegate.gateway.broker import Broker
from sluicegate.gateway.proton.internals import Selectable, c_object

_NULL: Final = ffi.NULL


class BrokerContainer(Container):
    """A ``Container`` whose event loop hands deliveries to the broker directly."""

    def __init__(self, broker: Broker, io: Handler) -> None:
        super().__init__(broker)
        # Proton's reactor makes its own IO handler; the setter is its public way to replace it.
        self.global_handler = io
        self._broker = broker
        # The IO handler's work once the events are handled (``FlowIO.quiesce``), called as
        # the reactor runs out of events rather than through a REACTOR_QUIESCED event.
        self._quiesce: Callable[[Container], None] | None = getattr(io, "quiesce", None)

    def process(self) -> bool:
        """Proton's ``Reactor.process`` with deliveries short-circuited (same yield and end)."""
        self.mark()
        collector = c_object(self._collector)
        broker = self._broker
        on_delivery = broker.on_delivery_of
        settlements = broker.settlements
        delivery_type = Event.DELIVERY
        quiesced = Event.REACTOR_QUIESCED
        quiesce = self._quiesce
        previous: object = PN_EVENT_NONE
        while True:
            if self._yield:
                self._yield = False
                broker.apply_settlements()
                return True
            impl = pn_collector_peek(collector)
            if impl != _NULL and pn_event_type(impl) == PN_DELIVERY:
                on_delivery(pn_event_delivery(impl))
                previous = self._previous = delivery_type
                pn_collector_pop(collector)
                if settlements.seqs:
                    settlements.extend(collector)
                continue
            if settlements.seqs:
                broker.apply_settlements()
            event = self._collector.peek()
            if event:
                handler = event.handler or self._handler
                event.dispatch(handler)
                event.dispatch(self._global_handler)
                previous = self._previous = event.type
                self._collector.pop()
            elif not self._stop and (self._timers > 0 or self._selectables > 1):
                if previous is not quiesced and self._previous is not Event.REACTOR_FINAL:
                    if quiesce is not None:
                        # What the event would reach, without the event: its wrapping and
                        # dispatch to every handler were a reactor pass's cost again.
                        previous = self._previous = quiesced
                        quiesce(self)
                        continue
                    self.push_event(self, quiesced)
                self.yield_()
            elif (timer := cast("Selectable | None", self._selectable)) is not None:
                timer.terminate()
                timer.update()
                self._selectable = None
            else:
                if self._previous is not Event.REACTOR_FINAL:
                    self.push_event(self, Event.REACTOR_FINAL)
                return False
