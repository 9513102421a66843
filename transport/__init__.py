"""What the server and the clients share below AMQP: the bytes between a socket and proton's
transport (TLS over memory BIOs, input fed within proton's capacity). It imports nothing of
sluicegate's, so gateway/ needs nothing of clients/ (docs/design.md)."""
