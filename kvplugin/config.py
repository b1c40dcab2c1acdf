"""The compaction settings as the engine processes see them, and the budget arithmetic.

The gateway (``embedded.kv_compaction``) or an operator passes the settings to every vLLM
process in one environment variable, ``GEARSHIFT_KV_COMPACTION`` (JSON), next to
``--scheduler-cls``. The scheduler and the worker both derive from it how many tokens a
request keeps, so the scheduler can free the right blocks without waiting for the worker:
the worker decides *which* tokens survive, never *how many*.

Pure Python (no vLLM, no torch), so the gateway's tests exercise it too.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

ENV_VAR = "GEARSHIFT_KV_COMPACTION"
# Set to a file path to have the scheduler and the worker append one JSON line per
# compaction (kept positions included): the tests compare them with a reference.
TRACE_ENV_VAR = "GEARSHIFT_KV_COMPACTION_TRACE"


class CompactionConfigError(ValueError):
    """The settings are inconsistent (e.g. a budget smaller than sinks + window)."""


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    enabled: bool = False
    # only a request whose prompt is longer than this is compacted
    trigger_tokens: int = 2048
    # when: "prompt", as soon as its prefill completes; "watermark", while it runs, once the
    # KV pool's usage reaches high_watermark, longest requests first until it is under
    # low_watermark (usage: the fraction of the pool's blocks in use, vLLM's kv_cache_usage)
    trigger: Literal["prompt", "watermark"] = "prompt"
    high_watermark: float = 0.9
    low_watermark: float = 0.7
    # tokens kept: an absolute count (> 1) or a fraction of the prompt (0 < budget <= 1)
    budget: float = 0.5
    # the observation window: the last `window` prompt tokens score the rest, and are kept
    window: int = 32
    # the first `sinks` tokens are always kept (StreamingLLM's attention sinks)
    sinks: int = 4
    # one selection per KV head instead of one per layer
    per_head: bool = False

    def __post_init__(self) -> None:
        if self.trigger_tokens < 1 or self.window < 1 or self.sinks < 0:
            raise CompactionConfigError(
                "trigger_tokens and window must be >= 1, sinks >= 0; got "
                f"{self.trigger_tokens}, {self.window}, {self.sinks}"
            )
        if self.trigger not in ("prompt", "watermark"):
            raise CompactionConfigError(f"trigger is 'prompt' or 'watermark', got {self.trigger!r}")
        if not 0 < self.low_watermark < self.high_watermark <= 1:
            raise CompactionConfigError(
                "watermarks must satisfy 0 < low_watermark < high_watermark <= 1; got "
                f"{self.low_watermark}, {self.high_watermark}"
            )
        if not self.budget > 0 or (self.budget > 1 and self.budget != int(self.budget)):
            raise CompactionConfigError(
                f"budget is a fraction in (0, 1] or a whole number of tokens, got {self.budget}"
            )
        if self.budget > 1 and self.budget < self.sinks + self.window:
            raise CompactionConfigError(
                f"a budget of {int(self.budget)} tokens cannot hold sinks ({self.sinks}) + "
                f"window ({self.window})"
            )

    def kept_tokens(self, prompt_tokens: int) -> int:
        """How many of a ``prompt_tokens``-long prompt's tokens stay in the cache
        (``prompt_tokens`` itself when the request is not compacted)."""
        if not self.enabled or prompt_tokens <= self.trigger_tokens:
            return prompt_tokens
        fraction = self.budget <= 1
        budget = math.ceil(self.budget * prompt_tokens) if fraction else int(self.budget)
        budget = max(budget, self.sinks + self.window)
        return min(budget, prompt_tokens)

    def to_env(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> CompactionConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise CompactionConfigError(f"unknown kv_compaction keys: {sorted(unknown)}")
        return cls(**dict(data))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CompactionConfig:
        """The settings in ``GEARSHIFT_KV_COMPACTION``; disabled when it is unset."""
        raw = (os.environ if environ is None else environ).get(ENV_VAR)
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CompactionConfigError(f"{ENV_VAR} is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise CompactionConfigError(f"{ENV_VAR} must be a JSON object")
        return cls.from_mapping(data)


def trace(record: Mapping[str, Any]) -> None:
    """Append ``record`` to the trace file when ``GEARSHIFT_KV_COMPACTION_TRACE`` names one."""
    path = os.environ.get(TRACE_ENV_VAR)
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(dict(record), sort_keys=True) + "\n")
