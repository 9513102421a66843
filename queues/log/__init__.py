"""The durable store: a segmented append-only log of CRC'd records (docs/durability.md).

``records`` lays records out as bytes and ``decoding`` reads them back; ``recovery`` replays them
into the state the server rebuilds and ``damage`` tells a torn tail from damage; ``ledger``
decides which segments compaction may delete; ``segments`` owns the files; ``placement``,
``changes``, ``topology``, ``bodies``, ``reading`` and ``store`` place records and read them back
for the reactor thread; ``check`` is ``sluicegate log check`` and ``repair``. Only ``segments``,
``bodies``, ``reading``, ``check`` and ``store`` touch files; the rest is pure and tested with
bytes.
"""
