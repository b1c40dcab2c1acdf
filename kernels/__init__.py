"""Triton kernels for KV-cache compaction, with torch references and CPU paths.

Imports only torch and triton (an import-linter contract checks it). Every launcher takes an
explicit ``backend``: ``"triton"`` (compiled on a GPU, or interpreted on CPU under
``TRITON_INTERPRET=1``) or ``"torch"`` (vectorized torch, for machines without a GPU).
See docs/kv-compaction.md.
"""

from kernels.compaction import MovePlan, apply_moves, copy_tokens, gather_tokens, plan_in_place
from kernels.layout import KernelInputError, KVLayout
from kernels.scoring import attention_scores, pool_scores, score_tokens
from kernels.selection import select_tokens

__all__ = [
    "KVLayout",
    "KernelInputError",
    "MovePlan",
    "apply_moves",
    "attention_scores",
    "copy_tokens",
    "gather_tokens",
    "plan_in_place",
    "pool_scores",
    "score_tokens",
    "select_tokens",
]
