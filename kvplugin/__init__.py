"""Gearshift's vLLM plugin: KV-cache compaction of live requests (docs/kv-compaction.md).

Installed into the engine's environment by scripts/install.sh and loaded by vLLM in every
one of its processes through the ``vllm.general_plugins`` entry point, which calls
``register``. Loading is idempotent and does nothing unless ``GEARSHIFT_KV_COMPACTION``
enables compaction; the scheduler half is selected separately with ``--scheduler-cls``
(``kvplugin.scheduler``). This package imports vLLM lazily: ``kvplugin.config`` is pure
Python and the gateway reads it too.
"""

from __future__ import annotations

import logging

from kvplugin.config import CompactionConfig

log = logging.getLogger("vllm.gearshift.kv_compaction")

_registered = False


def register() -> None:
    """Install the worker-side hooks when compaction is enabled (once per process)."""
    global _registered
    if _registered:
        return
    _registered = True
    config = CompactionConfig.from_env()
    if not config.enabled:
        return
    install_worker_hooks(config)
    log.info("KV compaction enabled: %s", config)


def install_worker_hooks(config: CompactionConfig) -> None:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from kvplugin import metrics, stream, worker

    if not getattr(CPUAttentionBackendImpl.forward, "_gearshift_kv", False):
        CPUAttentionBackendImpl.forward = worker.attention_forward(CPUAttentionBackendImpl.forward)
    if not getattr(CPUModelRunner.execute_model, "_gearshift_kv", False):
        CPUModelRunner.execute_model = worker.execute_model(CPUModelRunner.execute_model, config)
    if not getattr(CPUModelRunner.sample_tokens, "_gearshift_kv", False):
        CPUModelRunner.sample_tokens = worker.sample_tokens(CPUModelRunner.sample_tokens)
    metrics.install_frontend_hook()
    stream.install_stream_hooks()


def hooks_installed() -> bool:
    """Whether this process's CPU runner carries the hooks (for tests and diagnostics)."""
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    return bool(getattr(CPUModelRunner.execute_model, "_gearshift_kv", False))
