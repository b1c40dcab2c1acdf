"""Spare warm sandboxes, started before any session needs one (``sandbox.pool``).

A new session's first ``run_python`` or ``run_shell`` would otherwise wait for its
resident interpreter to start (bubblewrap, seccomp, a cgroup, then CPython: 30-90 ms).
The pool keeps, per *shape* (the resource class of a grant that allows those tools),
up to ``size`` spares: a fresh workspace (a tmpfs of its own, made as a session's is) with
a resident interpreter already running in it under that shape's limits, answering a ping.
``Sandbox.create`` hands one to the new session whose grant has that shape, and the pool
starts a replacement in the background.

What keeps sessions apart: a spare has never run tenant code (nothing but the ping has
reached it), it is handed out once (removed from the pool before the session gets it) and
never comes back (a removed session's workspace and runner are destroyed, as before).
Its limits are its shape's, the same a session would have started with. Once handed out
it is the session's: its workspace counts against the tenant's quota, its runner's memory
against the session's cgroup. Spares belong to no tenant; their number is bounded by
``size`` times the number of shapes in the configuration. ``close`` (service shutdown)
stops every spare and the starts in flight, and unmounts their workspaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sandbox.policy import ResourceClass
from sandbox.runtime.bwrap import BwrapRuntime
from sandbox.runtime.warm import WarmPython
from sandbox.workspace import Workspaces

log = logging.getLogger("gearshift.sandbox")


@dataclass(slots=True)
class Spare:
    root: Path  # its workspace, mounted
    warm: WarmPython  # its resident interpreter, up


class Pool:
    def __init__(
        self, workspaces: Workspaces, runtime: BwrapRuntime, size: int, kernel_usage: bool = False
    ) -> None:
        self.workspaces, self.runtime, self.size = workspaces, runtime, size
        self.kernel_usage = kernel_usage  # sandbox.kernel_usage, for the spares' runners
        self.ready: dict[ResourceClass, list[Spare]] = {}
        self._filling: dict[ResourceClass, asyncio.Task[None]] = {}
        self.active = False  # started: until then take() hands out nothing, fills nothing
        self.closed = False
        self.handed_out = 0
        self.started = 0

    def start(self, shapes: Iterable[ResourceClass]) -> None:
        """Begin filling the pool for ``shapes`` (in the background: call in a running loop)."""
        self.active = True
        for shape in dict.fromkeys(shapes):
            self.refill(shape)

    def take(self, shape: ResourceClass) -> Spare | None:
        """A ready spare of ``shape``, never handed out before, or None; a replacement
        starts in the background either way."""
        spares = self.ready.get(shape)
        spare = spares.pop(0) if spares else None
        if spare is not None:
            self.handed_out += 1
        self.refill(shape)
        return spare

    def refill(self, shape: ResourceClass) -> None:
        if not self.active or self.closed or self.size <= 0:
            return
        task = self._filling.get(shape)
        if task is not None and not task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): the next take refills
            return
        self._filling[shape] = loop.create_task(self._fill(shape))

    async def _fill(self, shape: ResourceClass) -> None:
        spares = self.ready.setdefault(shape, [])
        while not self.closed and len(spares) < self.size:
            try:
                spare = await self._start(shape)
            except Exception as exc:  # no workspace (mount failed), no cgroup: as below
                log.warning("sandbox pool: cannot start a spare: %r", exc)
                spare = None
            if spare is None:  # did not come up: the next take tries again
                log.warning("sandbox pool: a spare runner did not start; pool not refilled")
                return
            if self.closed:
                await self._discard(spare)
                return
            spares.append(spare)

    async def _start(self, shape: ResourceClass) -> Spare | None:
        root = self.workspaces.create(secrets.token_hex(16))  # swept like any workspace
        warm = WarmPython(self.runtime, root, shape, self.kernel_usage)
        try:
            up = await warm.prestart()
        except BaseException:  # cancelled by close(): nothing may stay running or mounted
            await asyncio.shield(self._discard(Spare(root, warm)))
            raise
        if not up:
            self.workspaces.remove(root)
            return None
        self.started += 1
        return Spare(root, warm)

    async def _discard(self, spare: Spare) -> None:
        await spare.warm.stop()
        self.workspaces.remove(spare.root)

    def count(self) -> int:
        return sum(len(s) for s in self.ready.values())

    async def close(self) -> None:
        """Stop every spare and every start in flight; unmount their workspaces."""
        self.closed = True
        tasks = list(self._filling.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        spares = [s for group in self.ready.values() for s in group]
        self.ready.clear()
        for spare in spares:
            await self._discard(spare)
