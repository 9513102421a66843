"""The session <- queue credit protocol between two workers (issue 35, docs/workers.md).

``frames`` names what crosses the channel, ``codec`` lays frames out as bytes and reads them
back from a byte stream with a bounded buffer, ``ends`` keeps each remote consumer's credit on
both sides so that the bounds of the local protocol hold across the channel. Pure: the gateway
owns the socket pair.
"""
