"""File tools, run host-side, confined to the workspace by the kernel.

Every path is opened with ``openat2(workspace_fd, path, RESOLVE_BENEATH |
RESOLVE_NO_MAGICLINKS)``: ``..``, absolute paths, symlinks that leave the
workspace and ``/proc/self/root``-style magic links are refused by the kernel
itself, whatever the string looks like, and whatever a sandboxed process has
since turned into a symlink (no check-then-use race). A naive
``open(os.path.join(workspace, path))`` allows all of them.

Tool code decides what the workspace holds, so nothing here may wait on it. A path is
first opened with ``O_PATH`` (no open method of the file runs: a FIFO does not wait for
a writer, a device does nothing), checked with ``fstat``, and only a regular file is
then opened for I/O, through ``/proc/self/fd`` of that same descriptor (the same inode,
whatever the path has become meanwhile). FIFOs, sockets and device nodes are refused
(``SpecialFile``); a symlink as the last component is refused as an ``Escape``. The work
runs on a small thread pool, never on the service's event loop, under the call's wall
time (``ToolTimeout``): a slow disk stalls one call, not the service.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import functools
import os
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from sandbox.errors import Escape, SpecialFile, ToolTimeout

SYS_OPENAT2 = 437  # x86_64 and aarch64
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
POOL_THREADS = 4  # file calls in flight at once, all tenants together
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")
Entries = list[dict[str, object]]  # list_dir's answer: name, type, size of each entry


class OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dirfd: int, path: str, flags: int, mode: int = 0) -> int:
    how = OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, dirfd, path.encode(), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.EXDEV or err == errno.ELOOP:
            raise Escape(f"{path!r} leaves the workspace")
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    return "not a regular file"


def reopen_regular(path_fd: int, path: str, flags: int) -> int:
    """Open for I/O (``flags``) the regular file that ``path_fd`` (an ``O_PATH``
    descriptor, closed here) names; refuse anything else before opening it."""
    try:
        mode = os.fstat(path_fd).st_mode
        if stat.S_ISLNK(mode):
            raise Escape(f"{path!r} is a symbolic link: file tools do not follow links")
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if not stat.S_ISREG(mode):
            raise SpecialFile(
                f"{path!r} is {_kind(mode)}: file tools touch regular files and directories only"
            )
        return os.open(f"/proc/self/fd/{path_fd}", flags | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(path_fd)


@functools.cache
def _pool() -> ThreadPoolExecutor:
    """The file tools' own threads: a stuck call never takes those of the runtimes."""
    return ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="sandbox-files")


async def off_loop(timeout_s: float, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the file tools' threads, waited for at most ``timeout_s``."""
    work = asyncio.get_running_loop().run_in_executor(_pool(), functools.partial(fn, *args))
    try:
        async with asyncio.timeout(timeout_s):
            return await work
    except TimeoutError:
        raise ToolTimeout(f"the file operation did not finish within {timeout_s:g} s") from None


class Workspace:
    """A directory that file tools may touch, and nothing outside it. Each method runs
    off the event loop and fails with ``ToolTimeout`` after ``timeout_s``."""

    def __init__(self, root: Path, uid: int, gid: int) -> None:
        self.root, self.uid, self.gid = root, uid, gid

    async def read(self, path: str, limit: int, timeout_s: float) -> tuple[bytes, bool]:
        """The file's first ``limit`` bytes, and whether there was more."""
        return await off_loop(timeout_s, self._read, path, limit)

    async def write(self, path: str, data: bytes, append: bool, timeout_s: float) -> int:
        return await off_loop(timeout_s, self._write, path, data, append)

    async def list(self, path: str, timeout_s: float) -> Entries:
        return await off_loop(timeout_s, self._list, path)

    def _dirfd(self) -> int:
        return os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def _path_fd(self, path: str) -> int:
        d = self._dirfd()
        try:
            return openat2(d, path, os.O_PATH | os.O_NOFOLLOW)
        finally:
            os.close(d)

    def _read(self, path: str, limit: int) -> tuple[bytes, bool]:
        fd = reopen_regular(self._path_fd(path), path, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)  # bounded, however large (or sparse) the file
        return data[:limit], len(data) > limit

    def _write(self, path: str, data: bytes, append: bool) -> int:
        try:
            fd = reopen_regular(
                self._path_fd(path), path, os.O_WRONLY | (os.O_APPEND if append else os.O_TRUNC)
            )
        except FileNotFoundError:  # a new file: O_EXCL, so nothing planted since is opened
            d = self._dirfd()
            try:
                fd = openat2(d, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            finally:
                os.close(d)
        with os.fdopen(fd, "wb") as f:
            os.fchown(f.fileno(), self.uid, self.gid)  # the sandboxed code may edit it too
            return f.write(data)

    def _list(self, path: str) -> Entries:
        d = self._dirfd()
        try:  # O_DIRECTORY: anything else is refused before its open method runs
            fd = openat2(d, path or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
        finally:
            os.close(d)
        try:
            out = []
            for name in sorted(os.listdir(fd)):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                kind = (
                    "dir"
                    if stat.S_ISDIR(st.st_mode)
                    else "link"
                    if stat.S_ISLNK(st.st_mode)
                    else "file"
                )
                out.append({"name": name, "type": kind, "size": st.st_size})
            return out
        finally:
            os.close(fd)
