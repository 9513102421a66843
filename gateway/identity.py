"""What the server says it is in its OPEN frame.

RabbitMQ's AMQP 1.0 client libraries refuse a server whose OPEN properties do not say
``product = "RabbitMQ"`` with a ``version`` of at least 4.0.0, and switch features on by that
version. With ``rabbitmq_compatible`` on (the default) sluicegate advertises the highest
RabbitMQ version whose AMQP 1.0 features it implements, and no higher, and names itself in its
own keys beside them; off, it advertises only itself (docs/management.md says what each
version needs).
"""

from __future__ import annotations

from typing import Final

from proton import symbol

from sluicegate.gateway.proton.internals import PythonAMQPData

PRODUCT: Final = "sluicegate"
VERSION: Final = "0.1.0"
# 4.0: the management v2 API and address v2, quorum queues, x-local-random exchanges.
# 4.1: property and application-property filters, stream filter values, x-cc routing keys,
# dynamic temporary queues. 4.2: SQL filters and Direct Reply-To. 4.3 would promise single
# active consumer state in FLOW properties, which sluicegate does not send.
RABBITMQ_VERSION: Final = "4.2.0"


def open_properties(rabbitmq_compatible: bool) -> dict[str, PythonAMQPData]:
    """The connection properties of the server's OPEN."""
    if not rabbitmq_compatible:
        return {symbol("product"): PRODUCT, symbol("version"): VERSION}
    return {
        symbol("product"): "RabbitMQ",
        symbol("version"): RABBITMQ_VERSION,
        symbol("sluicegate-product"): PRODUCT,
        symbol("sluicegate-version"): VERSION,
        symbol("information"): f"{PRODUCT} {VERSION}, compatible with RabbitMQ's AMQP 1.0 API",
    }
