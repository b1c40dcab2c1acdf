"""Feeding a sandboxed process's stdin when it may already have ended (uvloop and asyncio)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from sandbox.runtime.base import Streams

PIPE = asyncio.subprocess.PIPE


async def _ended_then_fed(stdin: bytes) -> tuple[bool, bytes]:
    proc = await asyncio.create_subprocess_exec("true", stdin=PIPE, stdout=PIPE, stderr=PIPE)
    io = Streams(proc, 1024)
    await proc.wait()
    for _ in range(50):  # let the loop see the pipes close
        if proc.stdin is not None and proc.stdin.is_closing():
            break
        await asyncio.sleep(0.01)
    return await io.run(stdin, 5.0), io.out.value()


async def _echoed(stdin: bytes) -> bytes:
    proc = await asyncio.create_subprocess_exec("cat", stdin=PIPE, stdout=PIPE, stderr=PIPE)
    io = Streams(proc, 1 << 20)
    assert await io.run(stdin, 5.0)
    return io.out.value()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@pytest.mark.parametrize("stdin", [b"", b"data for a process that is gone"])
def test_a_process_that_already_ended_is_not_an_error(loop, stdin):
    runner = uvloop.run if loop == "uvloop" else asyncio.run
    finished, out = runner(_ended_then_fed(stdin))
    assert finished and out == b""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_stdin_still_reaches_a_running_process(loop):
    runner = uvloop.run if loop == "uvloop" else asyncio.run
    data = b"x" * 300_000  # more than a pipe holds: drain must wait for the reader
    assert runner(_echoed(data)) == data
