"""How one vLLM OpenAI server is launched: its command line and environment.

Pure functions of a ``VllmServerSpec`` so they can be tested without starting
anything. The facts behind the flags (module entry point instead of ``vllm
serve``, explicit KV-cache size, one core per server) are in
docs/embedded-stack.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvplugin.config import ENV_VAR as KV_COMPACTION_ENV
from kvplugin.config import CompactionConfig as CompactionConfig  # re-exported for the CLI

# Offline, no telemetry, loopback only: the embedded stack never reaches a hub.
BASE_ENV: Mapping[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    # Only Gearshift's own plugin: arctic-inference (the suffix mode's suffix tree) also
    # registers one, which patches vLLM when loaded; vLLM imports its proposer by itself.
    "VLLM_PLUGINS": "gearshift_kv_compaction",
}


def ngram_speculation(tokens: int = 4, lookup_min: int = 2, lookup_max: int = 4) -> dict[str, Any]:
    """vLLM's ngram (prompt lookup) speculation: the next ``tokens`` tokens are drafted from
    the latest earlier occurrence of the last ``lookup_max``..``lookup_min`` tokens."""
    return {
        "method": "ngram",
        "num_speculative_tokens": tokens,
        "prompt_lookup_max": lookup_max,
        "prompt_lookup_min": lookup_min,
    }


NGRAM_SPECULATION: Mapping[str, Any] = ngram_speculation()

# Speculation methods vLLM runs with its synchronous scheduler (model-free proposers on CPU).
SYNC_SPECULATION = frozenset({"ngram", "suffix"})


def suffix_speculation(tokens: int = 16) -> dict[str, Any]:
    """vLLM's suffix decoding (arctic-inference's suffix tree): up to ``tokens`` tokens are
    drafted from suffixes of the prompt and of earlier answers; model-free, and lossless
    under greedy verification."""
    return {"method": "suffix", "num_speculative_tokens": tokens}


@dataclass(frozen=True, slots=True)
class VllmServerSpec:
    name: str  # tier name, used in logs
    model_dir: Path
    served_model_name: str
    port: int
    host: str = "127.0.0.1"
    cpu_bind: str | None = None  # e.g. "0": VLLM_CPU_OMP_THREADS_BIND
    max_model_len: int = 4096
    kv_cache_bytes: int = 256 * 1024 * 1024
    speculative: Mapping[str, Any] | None = None
    tool_call_parser: str = "hermes"
    dtype: str = "bfloat16"
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    # KV-cache compaction by Gearshift's vLLM plugin (kvplugin); None or disabled: off
    kv_compaction: CompactionConfig | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


def command(spec: VllmServerSpec, python: Path) -> list[str]:
    args = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(spec.model_dir),
        "--served-model-name",
        spec.served_model_name,
        "--host",
        spec.host,
        "--port",
        str(spec.port),
        "--dtype",
        spec.dtype,
        "--enforce-eager",
        "--max-model-len",
        str(spec.max_model_len),
        # Whole prompts only: a chunked prefill discards the token sampled for the unfinished
        # chunk and rewinds the request's seeded generator, which a CPU torch.Generator
        # cannot do ("CPU Generator does not use offset"): one request with `seed` and
        # temperature > 0 killed the engine. docs/embedded-stack.md.
        "--no-enable-chunked-prefill",
        "--max-num-batched-tokens",
        str(spec.max_model_len),
        "--kv-cache-memory-bytes",
        str(spec.kv_cache_bytes),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        spec.tool_call_parser,
    ]
    if spec.speculative is not None:
        args += ["--speculative-config", json.dumps(dict(spec.speculative), separators=(",", ":"))]
    return [*args, *compaction_args(spec), *spec.extra_args]


def compaction_args(spec: VllmServerSpec) -> list[str]:
    """The plugin's scheduler, of the kind vLLM would pick itself: the asynchronous one,
    except with ngram or suffix speculation, which vLLM runs synchronously. The async mode is set
    explicitly so class and mode cannot disagree (a synchronous subclass would silently
    turn async scheduling off; docs/kv-compaction.md)."""
    if spec.kv_compaction is None or not spec.kv_compaction.enabled:
        return []
    if spec.speculative is not None and spec.speculative.get("method") in SYNC_SPECULATION:
        return [
            "--scheduler-cls",
            "kvplugin.scheduler.CompactingScheduler",
            "--no-async-scheduling",
        ]
    return ["--scheduler-cls", "kvplugin.scheduler.CompactingAsyncScheduler", "--async-scheduling"]


def environment(spec: VllmServerSpec, base: Mapping[str, str]) -> dict[str, str]:
    env = {**base, **BASE_ENV}
    if spec.cpu_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_bind
    if spec.kv_compaction is not None and spec.kv_compaction.enabled:
        env[KV_COMPACTION_ENV] = spec.kv_compaction.to_env()
    else:
        env.pop(KV_COMPACTION_ENV, None)  # the plugin stays idle
    return env


def cpu_binds(cpus: list[int], servers: int) -> list[str | None]:
    """Split the CPUs evenly between servers, one contiguous range each.

    With fewer CPUs than servers no binding is set (vLLM then shares the cores).
    """
    if servers <= 0 or len(cpus) < servers:
        return [None] * servers
    share = len(cpus) // servers
    binds: list[str | None] = []
    for i in range(servers):
        part = cpus[i * share : (i + 1) * share]
        binds.append(str(part[0]) if len(part) == 1 else f"{part[0]}-{part[-1]}")
    return binds
