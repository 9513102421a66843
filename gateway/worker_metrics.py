"""One metrics scrape for a server of several workers: worker 0 adds up the others' pages.

Every worker keeps its own statistics (its queues, connections, memory). Workers 1 to N-1
serve their metrics on a loopback port of their own and leave its number in
``<data_dir>/worker-K/metrics.port``; worker 0, whose endpoint is the configured one, fetches
their pages when scraped and adds each sample to the same sample of its own (same name, same
labels), so every total is the server's: bytes held, messages published, connections, the
process's CPU seconds and resident memory. Start times take the earliest. A worker that does
not answer (it is being restarted) leaves its samples out, and ``sluicegate_workers_scraped``
says how many pages went into the sum.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

PORT_FILE: Final = "metrics.port"
# Seconds worker 0 waits for another worker's page: under the metrics snapshot's own 5 s, so a
# stuck worker costs a scrape its samples, not the scrape.
PEER_TIMEOUT: Final = 3.0
# Samples that are points in time, not amounts: the server's is the earliest of its workers'.
_EARLIEST: Final = ("_created", "process_start_time_seconds")


def publish_port(data_dir: Path, port: int) -> None:
    """Leave this worker's metrics port where worker 0 looks (written whole, then renamed)."""
    partial = data_dir / (PORT_FILE + ".new")
    partial.write_text(f"{port}\n")
    os.replace(partial, data_dir / PORT_FILE)


def peer_port_files(data_dir: Path, workers: int) -> list[Path]:
    """Worker 0's list of where the other workers leave their ports."""
    root = data_dir.parent
    return [root / f"worker-{index}" / PORT_FILE for index in range(1, workers)]


async def fetch_pages(files: list[Path], path: str) -> list[bytes]:
    """The other workers' pages at ``path``; a worker that does not answer is left out."""
    timeout = aiohttp.ClientTimeout(total=PEER_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        pages = await asyncio.gather(*(_page(client, file, path) for file in files))
    return [page for page in pages if page is not None]


async def _page(client: aiohttp.ClientSession, file: Path, path: str) -> bytes | None:
    try:
        port = int(file.read_text())
        async with client.get(f"http://127.0.0.1:{port}{path}") as response:
            if response.status != 200:
                return None
            return await response.read()
    except (OSError, ValueError, aiohttp.ClientError, TimeoutError):
        return None


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(pages: list[bytes], workers: int) -> bytes:
    """``pages`` (worker 0's first) as one page: each sample summed over the workers."""
    families: dict[str, Metric] = {}
    values: dict[tuple[str, str, tuple[tuple[str, str], ...]], float] = {}
    scraped = 0
    for page in pages:
        try:
            parsed = list(text_string_to_metric_families(page.decode()))
        except (ValueError, UnicodeDecodeError):
            # Not a metrics page: a port file left by a worker's earlier life, its port since
            # taken by something else.
            continue
        scraped += 1
        for family in parsed:
            known = families.setdefault(family.name, family)
            for sample in family.samples:
                key = (family.name, sample.name, tuple(sorted(sample.labels.items())))
                if key not in values:
                    values[key] = sample.value
                    if known is not family:
                        known.samples.append(sample)
                elif sample.name.endswith(_EARLIEST):
                    values[key] = min(values[key], sample.value)
                else:
                    values[key] += sample.value
    for name, family in families.items():
        family.samples = [
            sample._replace(value=values[(name, sample.name, tuple(sorted(sample.labels.items())))])
            for sample in family.samples
        ]
    merged = list(families.values())
    merged.append(GaugeMetricFamily("sluicegate_workers", "Worker processes.", value=workers))
    merged.append(
        GaugeMetricFamily(
            "sluicegate_workers_scraped",
            "Workers whose metrics this scrape adds up (the others are being restarted).",
            value=scraped,
        )
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(merged))
    return generate_latest(registry)
