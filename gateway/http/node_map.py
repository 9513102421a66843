"""RabbitMQ's ``/api/nodes`` for sluicegate's one node: memory, budget, descriptors, disk, log.

RabbitMQ's management UI shows each node's memory against its high watermark, descriptors and
free disk; sluicegate's analogues are the process's resident memory, the memory budget (its
watermark and alarm, session/memory_budget.py), its descriptors and the data directory's disk,
and the durable log's group commits (gateway/log_writer.py). Read on the reactor thread as one
API job: a few system calls and counters, bounded by the descriptor limit.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Final

from sluicegate.gateway.broker import Broker

# /proc/self/statm's second field is resident pages.
_PAGE: Final = os.sysconf("SC_PAGE_SIZE")


def node_map(broker: Broker, node: str) -> dict[str, object]:
    """The node in RabbitMQ's shape, with sluicegate's own figures under ``sluicegate_*``."""
    config = broker.config
    budget = broker.publishing.budget.statistics()
    durability = broker.publishing.durability
    resident = int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE
    return {
        "name": node,
        "type": "disc",
        "running": True,
        "mem_used": resident,
        "mem_limit": budget.limit,
        "mem_alarm": budget.blocked,
        "fd_used": len(os.listdir("/proc/self/fd")),
        "disk_free": shutil.disk_usage(config.data_dir).free,
        "disk_free_alarm": False,
        "sluicegate_budget": asdict(budget),
        "sluicegate_log": None if durability is None else asdict(durability.statistics()),
    }
