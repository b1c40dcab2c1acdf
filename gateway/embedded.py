"""The embedded default stack: default model, two supervised vLLM servers, their tiers.

Used by ``gearshift serve`` when the configuration names no replicas. Until
the fast-tier work lands, the fast tier serves the full model with ngram
speculative decoding (said at start-up): same family by construction, and a
real second server so routing, fallback and metrics are exercised end to end.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace

from backends.provision import DEFAULT_MODEL, provision
from backends.supervisor import Supervisor
from backends.vllm_server import NGRAM_SPECULATION, VllmServerSpec, cpu_binds
from gateway.config import EmbeddedSettings, TierSettings
from router.types import Tier

log = logging.getLogger(__name__)

FULL_MODEL_NAME = "smollm2-135m"
FAST_MODEL_NAME = "smollm2-135m-fast"


@dataclass(frozen=True, slots=True)
class EmbeddedStack:
    supervisor: Supervisor
    tiers: dict[Tier, TierSettings]


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
        kv_cache_bytes=settings.kv_cache_bytes,
    )
    fast = replace(
        full,
        name="fast",
        served_model_name=FAST_MODEL_NAME,
        port=settings.fast_port,
        cpu_bind=binds[1],
        speculative=NGRAM_SPECULATION,
    )
    log.info(
        "fast tier: serving the full-depth %s with ngram speculative decoding "
        "(the layer-pruned fast variant is not built yet)",
        DEFAULT_MODEL.name,
    )
    supervisor = Supervisor(
        [full, fast],
        python=settings.python,
        log_dir=settings.home / "logs",
        startup_timeout_s=settings.startup_timeout_s,
        max_restarts=settings.max_restarts,
    )
    tiers = {
        Tier.FULL: TierSettings(model=FULL_MODEL_NAME, replicas=[full.base_url]),
        Tier.FAST: TierSettings(model=FAST_MODEL_NAME, replicas=[fast.base_url]),
    }
    return EmbeddedStack(supervisor, tiers)
