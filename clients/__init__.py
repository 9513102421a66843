"""AMQP 1.0 client tools that ship with the server: quiver and the management client.

They import nothing of the server; they talk to any AMQP 1.0 server over a socket.
"""
