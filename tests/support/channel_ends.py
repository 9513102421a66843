"""A test's own copy of one worker's end of a channel (docs/workers.md), to write into it what
a broken or hostile peer would, from outside the server.

The channel is a socket pair only the two workers hold. The test finds the pair as ``ss -x``
does (sock_diag: each Unix socket's inode and its peer's) and takes a duplicate of the worker's
descriptor with ``pidfd_getfd`` (Linux 5.6), allowed to a process that may trace the worker:
the test is its supervisor's parent. Bytes written to it reach the other worker as if this
worker had sent them.
"""

from __future__ import annotations

import ctypes  # noqa: TID251 - pidfd_getfd, which os lacks; a test's reach into a worker only
import os
import socket
import struct
from pathlib import Path
from typing import Final

from support.workers import socket_inodes

# Linux's generic syscall number (x86_64 and aarch64 alike).
_PIDFD_GETFD: Final = 438
_NETLINK_SOCK_DIAG: Final = 4
_SOCK_DIAG_BY_FAMILY: Final = 20
_NLM_F_REQUEST_DUMP: Final = 0x1 | 0x300
_NLMSG_ERROR: Final = 2
_NLMSG_DONE: Final = 3
_UDIAG_SHOW_PEER: Final = 0x4
_UNIX_DIAG_PEER: Final = 2
_HEADER: Final = struct.Struct("<IHHII")
_REQUEST: Final = struct.Struct("<BBHIIIII")
_ATTRIBUTE: Final = struct.Struct("<HH")
# A unix_diag_msg: family, type, state, pad, inode, cookie.
_MESSAGE: Final = struct.Struct("<BBBBIII")


def unix_peers() -> dict[int, int]:
    """Each connected Unix socket's inode and its peer's."""
    request = _REQUEST.pack(
        socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, _UDIAG_SHOW_PEER, ~0 & 0xFFFFFFFF, ~0 & 0xFFFFFFFF
    )
    header = _HEADER.pack(
        _HEADER.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, 1, 0
    )
    peers: dict[int, int] = {}
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as diag:
        diag.send(header + request)
        while True:
            data = diag.recv(1 << 16)
            offset = 0
            while offset < len(data):
                length, kind, _, _, _ = _HEADER.unpack_from(data, offset)
                if kind == _NLMSG_DONE:
                    return peers
                if kind == _NLMSG_ERROR:
                    raise OSError("sock_diag refused the dump")
                inode = _MESSAGE.unpack_from(data, offset + _HEADER.size)[4]
                attribute = offset + _HEADER.size + _MESSAGE.size
                while attribute + _ATTRIBUTE.size <= offset + length:
                    size, kind = _ATTRIBUTE.unpack_from(data, attribute)
                    if kind == _UNIX_DIAG_PEER:
                        peers[inode] = struct.unpack_from("<I", data, attribute + 4)[0]
                    attribute += (size + 3) & ~3
                offset += (length + 3) & ~3


def _descriptor_of(pid: int, inode: int) -> int:
    """The number of the descriptor of process ``pid`` that is the socket ``inode``."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) == f"socket:[{inode}]":
                return int(fd.name)
        except OSError:
            continue
    raise AssertionError(f"process {pid} holds no socket {inode}")


def channel_end(pid: int, peer_pid: int) -> socket.socket:
    """A duplicate of worker ``pid``'s end of its channel to worker ``peer_pid``."""
    peers = unix_peers()
    theirs = socket_inodes(peer_pid)
    (inode,) = [mine for mine in socket_inodes(pid) if peers.get(mine) in theirs]
    pidfd = os.pidfd_open(pid)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(_PIDFD_GETFD, pidfd, _descriptor_of(pid, inode), 0)
        if fd < 0:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
    finally:
        os.close(pidfd)
    return socket.socket(fileno=fd)
