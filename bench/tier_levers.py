"""Candidate fast tiers ("levers"), each one vLLM server, started side by side for ``bench.tiers``.

A lever is a model folder and a speculative-decoding setting:

========================  ==================================================================
``full``                  the full model, plain decoding (the reference every ratio is to)
``pruned-ngram``          the embedded default fast tier: the pruned, healed model with ngram
                          speculation (6 tokens, n-grams of 2..4), ``fast_mode: lossy``
``full-ngram``            the full model with ngram speculation (4 tokens): ``fast_mode: ngram``
``full-suffix``           the full model with suffix decoding (vLLM method ``suffix``, 16
                          tokens; needs ``arctic-inference`` in the vLLM environment): lossless
``pruned-suffix``         the pruned model with suffix decoding
``int4-ngram``            the full model's weights as int4 (``bench.quantize_int4``; vLLM's
                          CPUWNA16 kernel) with ngram speculation, when that folder exists
``int4-suffix``           the same with suffix decoding
========================  ==================================================================

Every server is pinned to the same core (``--core``, default 1), so the levers compete for
nothing but the machine's noise, and they are measured in turns (``bench.tier_speed``).
``VLLM_PLUGINS`` names only Gearshift's own plugin: arctic-inference's plugin, which patches
vLLM on load, stays out (its ``suffix`` proposer is imported by vLLM itself when asked for).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from backends.supervisor import log_tail
from backends.vllm_server import (
    VllmServerSpec,
    command,
    environment,
    ngram_speculation,
    suffix_speculation,
)
from bench.procs import start, stop, wait_http
from bench.stack import free_port
from bench.tier_speed import Arm, one_answer

MODELS = Path(os.environ.get("GEARSHIFT_HOME", "~/.cache/gearshift")).expanduser() / "models"
SUFFIX: Mapping[str, Any] = suffix_speculation(16)
LEVERS: Mapping[str, tuple[str, Mapping[str, Any] | None]] = {
    "full": ("full", None),
    "pruned-ngram": ("pruned", ngram_speculation(6, 2, 4)),
    "full-ngram": ("full", ngram_speculation(4, 2, 4)),
    "full-suffix": ("full", SUFFIX),
    "pruned-suffix": ("pruned", SUFFIX),
    "int4-ngram": ("int4", ngram_speculation(6, 2, 4)),
    "int4-suffix": ("int4", SUFFIX),
}


def model_dirs(home: Path = MODELS) -> dict[str, Path]:
    """The provisioned full and pruned folders (and the int4 one, when it was made)."""
    found: dict[str, Path] = {}
    for d in sorted(home.glob("smollm2-135m-instruct-*")):
        kind = "pruned" if "-pruned-" in d.name else "int4" if d.name.endswith("-int4") else "full"
        if (d / "config.json").exists():
            found.setdefault(kind, d)
    return found


def spec_for(lever: str, dirs: Mapping[str, Path], port: int, core: str | None) -> VllmServerSpec:
    if lever not in LEVERS:
        raise ValueError(f"unknown lever {lever!r}; known: {', '.join(LEVERS)}")
    kind, speculative = LEVERS[lever]
    if kind not in dirs:
        raise ValueError(f"lever {lever}: no {kind} model folder under {MODELS}")
    return VllmServerSpec(
        name=lever, model_dir=dirs[kind], served_model_name=lever, port=port,
        cpu_bind=core, speculative=speculative,
    )  # fmt: skip


async def first_answer(arm: Arm) -> None:
    """One short greedy answer (raises RuntimeError when the server cannot give it)."""
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        try:
            await one_answer(session, arm, body)
        except aiohttp.ClientError as exc:
            raise RuntimeError(f"{arm.name}: {exc}") from None


@contextlib.contextmanager
def serving(
    levers: Sequence[str],
    core: str | None = "1",
    timeout_s: float = 1200,
    log_dir: Path | None = None,
) -> Iterator[list[Arm]]:
    """One vLLM server per lever (all started, then all awaited, each asked one short
    question); yields the arms of those that answered. Their logs go to ``log_dir``
    (default: a temporary folder)."""
    dirs = model_dirs()
    python = MODELS.parent / "vllm-venv" / "bin" / "python"
    with contextlib.ExitStack() as cleanup:
        tmp = log_dir or Path(cleanup.enter_context(tempfile.TemporaryDirectory()))
        tmp.mkdir(parents=True, exist_ok=True)
        arms, waits = [], []
        for lever in levers:
            spec = spec_for(lever, dirs, free_port(), core)
            env = environment(spec, os.environ)  # VLLM_PLUGINS: Gearshift's plugin only
            log = Path(tmp) / f"{lever}.log"
            proc = start(command(spec, python), log, env)
            cleanup.callback(stop, proc)
            arms.append(Arm(lever, spec.base_url, lever))
            waits.append((spec.base_url + "/v1/models", proc, log))
        serving = []
        for arm, (url, proc, log) in zip(arms, waits, strict=True):
            try:
                wait_http(url, proc, log, timeout_s=timeout_s)
                asyncio.run(first_answer(arm))
                serving.append(arm)
            except RuntimeError as exc:  # a lever that cannot start is reported, not fatal
                if arm.name == levers[0]:
                    raise
                print(f"lever {arm.name} did not start or answer: {str(exc)[-600:]}", flush=True)
                print(log_tail(log, 25), flush=True)
        print(f"levers serving: {', '.join(a.name for a in serving)}", flush=True)
        yield serving
