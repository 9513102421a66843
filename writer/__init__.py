"""Pure accounting of the connection writer: frames handed to the transport versus bytes written.

RabbitMQ's ``credit_flow`` between writer and session, measured on bytes that really reached the
socket, because proton's own output buffer is unbounded and invisible (docs/design.md).
"""
