"""CPU seconds of a running Gearshift stack's whole process tree, read from ``/proc`` (Linux).

The stack is the ``gearshift serve --port N`` process (``bench.stack.serve`` starts it that
way) and everything under it: the gateway, the tiers' vLLM servers and their engine
processes, the store's writer. ``StackCpu(port).seconds()`` sums user and system time of
every process of that tree alive at the call, with the time of children they already
reaped (``cutime``/``cstime``), so the difference of two calls is what the stack spent
between them, including a process that started or ended in that window.

``TreesCpu(roots)`` sums the same over several trees: ``bench.mix_replicas``' arm
(a second gateway, the stack's full-tier vLLM server and an extra one), each found by the
port in its command line (``serve_pid``, ``server_pid``).

Read from ``/proc`` (``bench.procs``) rather than with psutil, which the gateway's
environment does not install; the stack runs only on Linux (vLLM's CPU backend,
bubblewrap) anyway.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from bench.procs import process_tree, tree_cpu_seconds

PROC = Path("/proc")


def _pids() -> list[int]:
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]


def _argv(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:  # gone since the listing
        return []
    return [a.decode(errors="replace") for a in raw]


def _on_port(args: list[str], port: int) -> bool:
    ports = {b for a, b in itertools.pairwise(args) if a == "--port"}
    return str(port) in ports or f"--port={port}" in args


def serve_pid(port: int) -> int | None:
    """The pid of ``gearshift serve ... --port <port>`` on this machine, or None."""
    for pid in _pids():
        args = _argv(pid)
        launcher = any(Path(a).name == "gearshift" for a in args[:2]) and "serve" in args
        if launcher and _on_port(args, port):
            return pid
    return None


def server_pid(root: int, port: int) -> int | None:
    """The pid of the vLLM server started with ``--port <port>`` under ``root`` (a stack's
    tier server: its engine processes are its own descendants), or None."""
    for pid in process_tree(root):
        args = _argv(pid)
        if "vllm.entrypoints.openai.api_server" in args and _on_port(args, port):
            return pid
    return None


def tree(root: int) -> list[int]:
    """``root`` and its living descendants."""
    return process_tree(root)


class StackCpu:
    """The CPU time of the stack listening on ``port`` (``found`` is False when no
    ``gearshift serve`` process of this machine listens there: a remote gateway)."""

    def __init__(self, port: int) -> None:
        self.root = serve_pid(port)

    @property
    def found(self) -> bool:
        return self.root is not None

    def processes(self) -> int:
        return len(tree(self.root)) if self.root is not None else 0

    def seconds(self) -> float | None:
        return tree_cpu_seconds(self.root, reaped=True) if self.root is not None else None


class TreesCpu:
    """The CPU time of several process trees together (``found`` is False when a root is
    missing: then there are no figures)."""

    def __init__(self, roots: Sequence[int | None]) -> None:
        self.roots = [r for r in roots if r is not None]
        self.found = len(self.roots) == len(roots) > 0

    def processes(self) -> int:
        return sum(len(tree(r)) for r in self.roots)

    def seconds(self) -> float | None:
        return sum(tree_cpu_seconds(r, reaped=True) for r in self.roots) if self.found else None


Cpu = StackCpu | TreesCpu  # what an arm of bench.routed_mix is charged
