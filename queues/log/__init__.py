"""The durable store: a segmented append-only log of CRC'd records (DESIGN §3).

``records`` encodes and decodes records as bytes, ``recovery`` replays them into the state the
server rebuilds, ``ledger`` decides which segments compaction may delete, ``segments`` owns the
files and ``store`` ties them together for the reactor thread. Only ``segments`` and ``store``
touch files; the rest is pure and tested with bytes.
"""
