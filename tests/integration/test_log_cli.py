"""A damaged log as an operator meets it: the server refuses, ``log check`` says why, ``log
repair`` cuts the damage away saying what it dropped, and the server starts again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from proton import Message
from support.clients import consume, publish
from support.process import SERVE, serving

from sluicegate.queues.log.decoding import iter_records
from sluicegate.queues.log.records import Enqueued
from sluicegate.queues.log.segments import CLEAN_SHUTDOWN, list_segments, segment_path

_COUNT = 300


def _log(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluicegate", "log", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_a_missing_segment_refuses_start_until_repaired_and_repair_says_what_it_lost(
    tmp_path: Path,
) -> None:
    options = ("--data-dir", str(tmp_path), "--log-segment-size", "8192")
    messages = [Message(body=f"m{i}-" + "x" * 100, durable=True) for i in range(_COUNT)]
    with serving(*options) as (_, port):
        outcomes = publish(f"amqp://127.0.0.1:{port}", "/queues/kept", messages=messages).outcomes
        assert outcomes == ["accepted"] * _COUNT
    log = tmp_path / "log"
    # A clean stop says where the log ends: a last segment emptied or deleted is seen.
    assert (log / CLEAN_SHUTDOWN).read_text().split()[0] == str(list_segments(log)[-1])
    segments = list_segments(log)
    missing = segments[len(segments) // 2]
    lost = sum(
        isinstance(record, Enqueued)
        for _, record in iter_records(segment_path(log, missing).read_bytes())
    )
    segment_path(log, missing).unlink()

    refused = subprocess.run(
        [*SERVE, "--listen", "127.0.0.1:0", *options],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1
    assert f"segment {missing}: missing" in refused.stderr
    checked = _log("check", str(tmp_path))
    assert checked.returncode == 1
    assert f"DAMAGED segment {missing}: missing" in checked.stdout
    repaired = _log("repair", str(tmp_path))
    assert repaired.returncode == 0, repaired.stderr
    assert f"segment {missing} is missing: whatever it held is lost" in repaired.stdout
    assert _log("check", str(tmp_path)).returncode == 0

    assert lost > 0
    with serving(*options) as (_, port):
        bodies = consume(f"amqp://127.0.0.1:{port}", "/queues/kept", _COUNT - lost).bodies
    # What the missing segment held is gone; everything else is there, in order.
    numbers = [int(str(body).split("-")[0][1:]) for body in bodies]
    assert numbers == sorted(numbers)
    assert len(set(numbers)) == _COUNT - lost
