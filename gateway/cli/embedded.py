"""The embedded default stack: default model, two supervised vLLM servers, their tiers.

Used by ``gearshift serve`` when the configuration names no replicas. In the ``routed``
layout (the default) the second server is the fast tier, built from the full model by
``backends.pruning`` at provisioning time (cached) and served in the configured
``embedded.fast_mode`` (docs/fast-tier.md); in ``full-replicas`` it is a second replica of
the full tier and there is no fast tier (docs/embedded-stack.md). ``serve`` says at
start-up which runs.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Any

from backends.family import check_same_family, fingerprint
from backends.provision import (
    DEFAULT_MODEL,
    PruneOptions,
    provision,
    provision_pruned,
    require_module,
)
from backends.supervisor import Supervisor
from backends.vllm_server import (
    CompactionConfig,
    VllmServerSpec,
    cpu_binds,
    ngram_speculation,
    suffix_speculation,
)
from gateway.config import EmbeddedSettings, RouterSettings, TierSettings
from router.classifier import Classifier
from router.policy import PolicyError, build_policy, parts
from router.types import Tier

log = logging.getLogger(__name__)

FULL_MODEL_NAME = "smollm2-135m"
FAST_MODEL_NAME = "smollm2-135m-fast"


@dataclass(frozen=True, slots=True)
class EmbeddedStack:
    supervisor: Supervisor
    tiers: dict[Tier, TierSettings]


def prune_options(settings: EmbeddedSettings) -> PruneOptions:
    """How the embedded fast-tier model is pruned and healed."""
    return PruneOptions(
        settings.prune_remove,
        settings.prune_method,
        settings.heal_steps,
        settings.heal_data,
        settings.heal_samples,
    )


def fast_tier_identity(settings: EmbeddedSettings) -> dict[str, Any]:
    """What decides how the fast tier answers: the model and, for the lossy mode, how it
    was pruned. The router's models learn where this tier falls short, so their files
    record it (``training.fast_tier``); speculation settings and dtype do not change it."""
    tier: dict[str, Any] = {"model": DEFAULT_MODEL.name, "mode": settings.fast_mode}
    if settings.fast_mode == "lossy":
        tier.update(
            prune_remove=settings.prune_remove,
            prune_method=settings.prune_method,
            heal_steps=settings.heal_steps,
        )
        # absent from records made before it existed, and meaningless without healing
        if prune_options(settings).other_heal_data:
            tier.update(heal_data=settings.heal_data, heal_samples=settings.heal_samples)
    return tier


def _settings(tier: dict[str, Any], keys: list[str]) -> str:
    """``k=v, ...`` for the keys the tier has; a calibration-healed tier records no heal_data."""
    shown = (
        {**tier, "heal_data": tier.get("heal_data", "calibration")}
        if tier.get("heal_steps")
        else tier
    )
    return ", ".join(f"{k}={shown[k]}" for k in keys if k in shown)


def router_mismatches(router: RouterSettings, settings: EmbeddedSettings) -> list[str]:
    """One warning per router model that learned from another fast tier than this one:
    its scores and threshold then describe a tier that is not serving."""
    if settings.layout == "full-replicas":  # no fast tier: 'auto' is served by full anyway
        return []
    try:
        policy = build_policy(router.policy, router.params)
    except PolicyError:
        return []  # the gateway reports the configuration error itself
    serving = fast_tier_identity(settings)
    warnings: dict[str, str] = {}
    models = [part for part in parts(policy) if isinstance(part, Classifier)]
    for model in models:
        trained = model.fast_tier
        if trained is None or trained == serving:
            continue
        differs = sorted(
            k for k in serving.keys() | trained.keys() if serving.get(k) != trained.get(k)
        )
        warnings[model.source] = (
            f"router model {model.source} learned from a fast tier with "
            + _settings(trained, differs)
            + "; this one has "
            + _settings(serving, differs)
            + ": its scores no longer describe the serving tier; collect this tier's outcomes "
            "and retrain (docs/fast-tier.md)"
        )
    return list(warnings.values())


def _fast_spec(
    settings: EmbeddedSettings, full: VllmServerSpec, cpu_bind: str | None
) -> tuple[VllmServerSpec, str]:
    """The fast tier's server for the configured mode, and a sentence saying what it is."""
    base = replace(
        full,
        name="fast",
        served_model_name=FAST_MODEL_NAME,
        port=settings.fast_port,
        cpu_bind=cpu_bind,
    )
    # 6 drafted tokens for the pruned model (measured faster than 4 in two runs each, in
    # turns: docs/fast-tier.md); the full model's ngram mode keeps the 4 it was measured with
    drafted = settings.speculative_tokens or (6 if settings.fast_mode == "lossy" else 4)
    ngram = ngram_speculation(drafted, settings.ngram_min, settings.ngram_max)
    if settings.fast_mode == "ngram":
        return replace(base, speculative=ngram), (
            f"the full-depth {DEFAULT_MODEL.name} with ngram speculative decoding (fast_mode: ngram)"
        )
    if settings.fast_mode == "suffix":
        require_module(
            settings.python,
            "arctic_inference",
            "fast_mode: suffix needs it; run scripts/install.sh --with-suffix",
        )
        # 16 drafted tokens: the value measured on this model (REFERENCES.md, bench.tiers levers)
        suffix = suffix_speculation(settings.speculative_tokens or 16)
        return replace(base, speculative=suffix), (
            f"the full-depth {DEFAULT_MODEL.name} with suffix decoding: greedy outputs match the "
            "full tier's, repeated output is drafted from the prompt and earlier answers "
            "(fast_mode: suffix)"
        )
    pruned = provision_pruned(
        settings.home, settings.python, full.model_dir, prune_options(settings)
    )
    if settings.fast_mode == "lossy":
        return replace(base, model_dir=pruned, speculative=ngram), (
            f"{DEFAULT_MODEL.name} with {settings.prune_remove} layers pruned ({settings.prune_method}, "
            f"{settings.heal_steps} healing steps on {settings.heal_data} data) and ngram speculative "
            "decoding (fast_mode: lossy)"
        )
    draft = {
        "method": "draft_model",
        "model": str(pruned),
        "num_speculative_tokens": settings.speculative_tokens or 3,
    }
    return replace(base, speculative=draft), (
        f"the full-depth {DEFAULT_MODEL.name} drafted by its {settings.prune_remove}-layer-pruned variant: "
        "greedy outputs match the full tier (fast_mode: lossless)"
    )


def pruned_model_needed(settings: EmbeddedSettings) -> bool:
    """Whether the stack serves the pruned checkpoint (the ~15-minute build of provisioning):
    the lossy fast tier serves it, the lossless one drafts with it; the other modes and the
    full-replicas layout serve the full model only."""
    return settings.layout == "routed" and settings.fast_mode in ("lossy", "lossless")


def build_stack(settings: EmbeddedSettings) -> EmbeddedStack:
    model_dir = provision(settings.home, settings.python, DEFAULT_MODEL)
    binds = cpu_binds(sorted(os.sched_getaffinity(0)), 2)
    full = VllmServerSpec(
        name="full",
        model_dir=model_dir,
        served_model_name=FULL_MODEL_NAME,
        port=settings.full_port,
        cpu_bind=binds[0],
        max_model_len=settings.max_model_len,
        # float32 entries take twice the bytes of bf16 ones: keep the same token capacity.
        kv_cache_bytes=settings.kv_cache_bytes * (2 if settings.dtype == "float32" else 1),
        dtype=settings.dtype,
        # KV-cache compaction per tier (docs/kv-compaction.md); off unless configured
        kv_compaction=CompactionConfig(**settings.kv_compaction.full.model_dump()),
    )
    if settings.layout == "full-replicas":
        # the second core as a second full replica: docs/decisions/fast-tier-on-cpu-hosts.md
        second = replace(full, name="full-2", port=settings.fast_port, cpu_bind=binds[1])
        log.info(
            "layout full-replicas: %s on each core, both replicas of the full tier; no fast "
            "tier (model 'auto' is served by full, model 'fast' does not exist)",
            DEFAULT_MODEL.name,
        )
        full_tier = _tier(full, [full.base_url, second.base_url])
        return _stack(settings, [full, second], {Tier.FULL: full_tier})
    fast, description = _fast_spec(settings, full, binds[1])
    fast = replace(fast, kv_compaction=CompactionConfig(**settings.kv_compaction.fast.model_dump()))
    log.info("fast tier: %s", description)
    # Refuse to start two tiers that could not share a conversation.
    check_same_family(
        {str(s.name): fingerprint(s.model_dir, s.tool_call_parser) for s in (full, fast)}
    )
    tiers = {Tier.FULL: _tier(full, [full.base_url]), Tier.FAST: _tier(fast, [fast.base_url])}
    return _stack(settings, [full, fast], tiers)


def _tier(spec: VllmServerSpec, replicas: list[str]) -> TierSettings:
    return TierSettings(
        model=spec.served_model_name, replicas=replicas, tool_call_parser=spec.tool_call_parser
    )


def _stack(
    settings: EmbeddedSettings, specs: list[VllmServerSpec], tiers: dict[Tier, TierSettings]
) -> EmbeddedStack:
    """The supervisor of ``specs`` (started by `serve`), and the tiers they serve."""
    supervisor = Supervisor(
        specs,
        python=settings.python,
        log_dir=settings.home / "logs",
        startup_timeout_s=settings.startup_timeout_s,
        max_restarts=settings.max_restarts,
    )
    return EmbeddedStack(supervisor, tiers)
