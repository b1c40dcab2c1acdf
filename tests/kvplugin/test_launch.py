"""How `embedded.kv_compaction` reaches the vLLM servers: flags and environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from backends.vllm_server import NGRAM_SPECULATION, VllmServerSpec, command, environment
from gateway.config import EmbeddedSettings, KVCompactionTier
from kvplugin.config import ENV_VAR, CompactionConfig

ON = CompactionConfig(enabled=True, trigger_tokens=1024, budget=0.5)


def spec(**kw: object) -> VllmServerSpec:
    return VllmServerSpec(name="full", model_dir=Path("/m"), served_model_name="s", port=1, **kw)  # type: ignore[arg-type]


def flags(argv: list[str]) -> list[str]:
    i = argv.index("--scheduler-cls")
    return argv[i : i + 3]


def test_off_by_default_and_when_disabled() -> None:
    for s in (spec(), spec(kv_compaction=CompactionConfig())):
        assert "--scheduler-cls" not in command(s, Path("p"))
        # a stale setting in the supervisor's own environment does not leak through
        assert ENV_VAR not in environment(s, {ENV_VAR: ON.to_env()})


def test_async_scheduler_unless_ngram_speculation() -> None:
    assert flags(command(spec(kv_compaction=ON), Path("p"))) == [
        "--scheduler-cls", "kvplugin.scheduler.CompactingAsyncScheduler", "--async-scheduling",
    ]  # fmt: skip
    ngram = spec(kv_compaction=ON, speculative=NGRAM_SPECULATION)
    assert flags(command(ngram, Path("p"))) == [
        "--scheduler-cls", "kvplugin.scheduler.CompactingScheduler", "--no-async-scheduling",
    ]  # fmt: skip
    env = environment(ngram, {})
    assert CompactionConfig.from_mapping(json.loads(env[ENV_VAR])) == ON


def test_settings_per_tier() -> None:
    settings = EmbeddedSettings.model_validate(
        {"kv_compaction": {"full": {"enabled": True, "budget": 512, "trigger_tokens": 2000}}}
    )
    full, fast = settings.kv_compaction.full, settings.kv_compaction.fast
    assert CompactionConfig(**full.model_dump()).kept_tokens(3000) == 512
    assert not fast.enabled and not EmbeddedSettings().kv_compaction.full.enabled
    # the gateway's settings and the plugin's carry the same keys and defaults
    assert CompactionConfig(**KVCompactionTier().model_dump()) == CompactionConfig()
    watermark = {
        "enabled": True,
        "trigger": "watermark",
        "high_watermark": 0.8,
        "low_watermark": 0.6,
    }
    tier = EmbeddedSettings.model_validate(
        {"kv_compaction": {"fast": watermark}}
    ).kv_compaction.fast
    assert CompactionConfig(**tier.model_dump()) == CompactionConfig(**watermark)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"budget": 0}, {"budget": 10}, {"budget": 100.5}, {"window": 0}, {"nope": 1},
        {"trigger": "usage"}, {"high_watermark": 1.5}, {"low_watermark": 0.9},
        {"high_watermark": 0.5, "low_watermark": 0.6},
    ],
)  # fmt: skip
def test_invalid_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        EmbeddedSettings.model_validate({"kv_compaction": {"fast": bad}})
