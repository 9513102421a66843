"""A damaged log as an operator meets it: the server refuses, ``log check`` says why, ``log
repair`` cuts the damage away saying what it dropped, and the server starts again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from proton import Message, Timeout
from proton.utils import BlockingConnection
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


@pytest.mark.alone  # binds a default port: docs/testing.md
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


# -- a log directory tampered with (issue 31) ------------------------------------------------

_TAMPERED_COUNT = 1000
_SEGMENT_OPTIONS = ("--log-segment-size", "8192")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory whose queue ``kept`` holds _TAMPERED_COUNT confirmed messages in many
    segments, stopped cleanly; each test tampers with a copy."""
    data_dir = tmp_path_factory.mktemp("pristine")
    messages = [Message(body=f"m{i}-" + "x" * 100, durable=True) for i in range(_TAMPERED_COUNT)]
    with serving("--data-dir", str(data_dir), *_SEGMENT_OPTIONS) as (_, port):
        published = publish(f"amqp://127.0.0.1:{port}", "/queues/kept", messages=messages)
    assert published.outcomes == ["accepted"] * _TAMPERED_COUNT
    assert len(list_segments(data_dir / "log")) > 10
    return data_dir


def _copy(pristine: Path, tmp_path: Path) -> tuple[Path, Path]:
    data_dir = tmp_path / "data"
    shutil.copytree(pristine, data_dir)
    return data_dir, data_dir / "log"


def _start(data_dir: Path) -> subprocess.CompletedProcess[str]:
    """Start the server on ``data_dir`` expecting it to refuse: its exit and what it said."""
    return subprocess.run(
        [*SERVE, "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), *_SEGMENT_OPTIONS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _kept_once_each(data_dir: Path, expected: int) -> list[int]:
    """Start the server and take the whole queue: each message once, in order, none more."""
    with serving("--data-dir", str(data_dir), *_SEGMENT_OPTIONS) as (_, port):
        url = f"amqp://127.0.0.1:{port}"
        bodies = consume(url, "/queues/kept", expected).bodies
        connection = BlockingConnection(url, timeout=10)
        try:
            with pytest.raises(Timeout):
                connection.create_receiver("/queues/kept").receive(timeout=1.0)
        finally:
            connection.close()
    numbers = [int(str(body).split("-")[0][1:]) for body in bodies]
    assert numbers == sorted(set(numbers))
    return numbers


def _enqueues(log: Path, segment: int) -> int:
    data = segment_path(log, segment).read_bytes()
    return sum(isinstance(record, Enqueued) for _, record in iter_records(data))


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stderr
    assert "Traceback" not in result.stdout


@pytest.mark.alone  # binds a default port: docs/testing.md
@pytest.mark.slow
def test_an_emptied_middle_segment_is_damage_and_repair_removes_it(
    pristine: Path, tmp_path: Path
) -> None:
    data_dir, log = _copy(pristine, tmp_path)
    segments = list_segments(log)
    emptied = segments[len(segments) // 2]
    lost = _enqueues(log, emptied)
    with segment_path(log, emptied).open("r+b") as file:
        file.truncate(0)
        os.fsync(file.fileno())
    refused = _start(data_dir)
    assert refused.returncode == 1
    assert f"segment {emptied} at offset 0: the segment has no header" in refused.stderr
    checked = _log("check", str(data_dir))
    assert checked.returncode == 1
    assert f"DAMAGED segment {emptied} at offset 0" in checked.stdout
    repaired = _log("repair", str(data_dir))
    assert repaired.returncode == 0, repaired.stderr
    assert f"removed segment {emptied}" in repaired.stdout
    assert _log("check", str(data_dir)).returncode == 0
    assert lost > 0
    assert len(_kept_once_each(data_dir, _TAMPERED_COUNT - lost)) == _TAMPERED_COUNT - lost


@pytest.mark.alone  # binds a default port: docs/testing.md
@pytest.mark.slow
@pytest.mark.parametrize("stray", ["2.seg", "02.seg", "\u00b2.seg"])
def test_a_stray_segment_name_is_refused_never_replayed_twice(
    pristine: Path, tmp_path: Path, stray: str
) -> None:
    """``2.seg`` beside ``00000000000000000002.seg`` replayed segment 2 twice: its messages
    came back twice. Only the names the server writes are segments."""
    data_dir, log = _copy(pristine, tmp_path)
    shutil.copyfile(segment_path(log, 2), log / stray)
    refused = _start(data_dir)
    assert refused.returncode == 1
    assert f"file {stray!r}: named like a segment" in refused.stderr
    checked = _log("check", str(data_dir))
    assert checked.returncode == 1
    assert f"DAMAGED file {stray!r}" in checked.stdout
    repaired = _log("repair", str(data_dir))
    assert repaired.returncode == 0, repaired.stderr
    assert f"renamed {stray!r} to {stray + '.stray'!r}" in repaired.stdout
    assert (log / f"{stray}.stray").read_bytes() == segment_path(log, 2).read_bytes()
    assert _kept_once_each(data_dir, _TAMPERED_COUNT) == list(range(_TAMPERED_COUNT))


@pytest.mark.alone  # binds a default port: docs/testing.md
@pytest.mark.slow
def test_a_huge_sparse_segment_is_refused_unread(pristine: Path, tmp_path: Path) -> None:
    data_dir, log = _copy(pristine, tmp_path)
    last = list_segments(log)[-1]
    with segment_path(log, last).open("r+b") as file:
        file.truncate(3 * 1024**3)
        os.fsync(file.fileno())
    refused = _start(data_dir)
    assert refused.returncode == 1
    assert f"segment {last} at offset 0: the file is {3 * 1024**3} bytes" in refused.stderr
    for action in ("check", "repair"):
        result = _log(action, str(data_dir))
        _no_traceback(result)
        assert result.returncode == 1
    assert "NOT REPAIRED" in result.stdout
    # Cut back to its data by the operator, the log is whole again.
    with segment_path(log, last).open("r+b") as file:
        file.truncate(segment_path(pristine / "log", last).stat().st_size)
        os.fsync(file.fileno())
    assert _kept_once_each(data_dir, _TAMPERED_COUNT) == list(range(_TAMPERED_COUNT))


@pytest.mark.slow
def test_a_garbage_clean_shutdown_marker_is_ignored_and_reported(
    pristine: Path, tmp_path: Path
) -> None:
    data_dir, log = _copy(pristine, tmp_path)
    (log / CLEAN_SHUTDOWN).write_bytes(b"\xff\xfe not a marker \x00" * 100)
    checked = _log("check", str(data_dir))
    assert checked.returncode == 0, checked.stdout
    assert f"ignored: the {CLEAN_SHUTDOWN} marker does not say where the log ends" in (
        checked.stdout
    )
    assert "not closed cleanly" in checked.stdout
    assert _kept_once_each(data_dir, _TAMPERED_COUNT) == list(range(_TAMPERED_COUNT))


@pytest.mark.slow
def test_log_tools_answer_unreadable_input_with_an_exit_status(tmp_path: Path) -> None:
    """A directory where a segment should be, or a bad option: a message, never a traceback."""
    log = tmp_path / "log"
    log.mkdir()
    segment_path(log, 1).mkdir()
    for action in ("check", "repair"):
        result = _log(action, str(tmp_path))
        _no_traceback(result)
        assert result.returncode == 2
        assert f"sluicegate: cannot {action} the log" in result.stderr
    bad = _log("check", str(tmp_path), "--log-segment-size", "lots")
    _no_traceback(bad)
    assert bad.returncode == 2
