"""The ``full-x2`` arm of ``bench.routed_mix``: always-full over two full-model replicas.

The embedded stack binds its full tier's vLLM server to one core and its fast tier's to the
other, so the always-full arm runs on one core while the routed arm uses both. The baseline
an operator with this machine would weigh against a fast tier is a second full replica on
that second core. ``full_x2`` starts it next to a running stack (``bench.stack.Stack``):

- one more vLLM server with the full model, built as ``gearshift serve`` builds the embedded
  full tier (``gateway.cli.embedded.build_stack``: same model folder, flags and KV cache; its
  launcher ``backends.vllm_server``), bound to the fast tier's core;
- a second ``gearshift serve``, configured with replicas rather than embedded: the full tier
  is the stack's full server and the extra one, the fast tier the stack's fast server, the
  store recording on a SQLite file of its own, the stack's router settings.

The arm asks that gateway for ``model: full``; its pool spreads the requests over both
replicas (fewest in flight first). It is charged the CPU of its own process trees
(``bench.mix_cpu.TreesCpu``): the second gateway's, the stack's full server's and the
extra server's; the idle fast server is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from backends.vllm_server import VllmServerSpec, cpu_binds
from backends.vllm_server import command as vllm_command
from backends.vllm_server import environment as vllm_environment
from bench.mix_cpu import TreesCpu, serve_pid, server_pid
from bench.procs import start, stop, wait_http
from bench.stack import Stack, free_port, serve
from bench.tier_levers import first_answer
from bench.tier_speed import Arm
from gateway.cli.embedded import build_stack
from gateway.config import Settings


@dataclass(frozen=True)
class Replicas:
    url: str  # the second gateway
    cpu: TreesCpu  # its tree, the stack's full server's and the extra server's


def port_of(url: str) -> int:
    return urlsplit(url).port or 80


def tiers_env(stack: Stack, full: VllmServerSpec, fast: VllmServerSpec, extra_url: str) -> dict[str, str]:  # fmt: skip
    """The second gateway's tiers: both full servers as the full tier's replicas, the
    stack's fast server as the fast tier (the embedded stack's model names and parser)."""
    tiers = {
        "full": {"model": full.served_model_name, "replicas": [stack.full_url, extra_url]},
        "fast": {"model": fast.served_model_name, "replicas": [stack.fast_url]},
    }
    for tier, spec in (("full", full), ("fast", fast)):
        tiers[tier]["tool_call_parser"] = spec.tool_call_parser
    return {"GEARSHIFT_TIERS": json.dumps(tiers)}


@contextlib.contextmanager
def full_x2(stack: Stack, env: Mapping[str, str], timeout_s: float = 1200) -> Iterator[Replicas]:
    """The extra full server (answering once) and the second gateway over both replicas;
    ``env``: the second gateway's store and router settings. Both stop on exit."""
    embedded = Settings().embedded
    servers = build_stack(embedded).supervisor.servers  # the specs; nothing starts here
    full, fast = servers["full"].spec, servers["fast"].spec
    second_core = cpu_binds(sorted(os.sched_getaffinity(0)), 2)[1]  # the fast tier's core
    spec = replace(full, name="full-2", port=free_port(), cpu_bind=second_core)
    with tempfile.TemporaryDirectory(prefix="gearshift-x2-") as tmp:
        log = Path(tmp) / "full-2.log"
        proc = start(vllm_command(spec, embedded.python), log, vllm_environment(spec, os.environ))
        try:
            wait_http(spec.base_url + "/health", proc, log, timeout_s=timeout_s)
            asyncio.run(first_answer(Arm(spec.name, spec.base_url, spec.served_model_name)))
            gateway_env = {**env, **tiers_env(stack, full, fast, spec.base_url)}
            with serve(Path(tmp) / "serve.log", gateway_env, timeout_s=timeout_s) as gateway:
                stack_root = serve_pid(port_of(stack.url))
                full_pid = server_pid(stack_root, port_of(stack.full_url)) if stack_root else None
                cpu = TreesCpu([serve_pid(port_of(gateway.url)), full_pid, proc.pid])
                yield Replicas(gateway.url, cpu)
        finally:
            stop(proc)
