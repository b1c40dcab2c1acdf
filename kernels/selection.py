"""Which tokens to keep: attention sinks, a recent window, and the top scores in between.

StreamingLLM showed the first few tokens soak up attention whatever they say (sinks) and the
most recent ones matter most; SnapKV keeps, between them, the tokens the observation window
attends to. By default one selection serves every KV head of a layer (scores averaged over
heads), which keeps the compacted cache rectangular per layer; ``per_head=True`` selects for
each head separately (Ada-KV-style budgets stay equal per head so the block table is shared).
"""

from __future__ import annotations

import torch

from kernels.layout import KernelInputError


def select_tokens(
    scores: torch.Tensor, budget: int, *, sinks: int = 4, window: int = 32, per_head: bool = False
) -> torch.Tensor:
    """Sorted positions to keep: ``[layers, 1, n]`` (or ``[layers, kv_heads, n]`` per head).

    ``scores``: ``[layers, kv_heads, seq_len]`` (from ``score_tokens``). ``n`` is
    ``min(budget, seq_len)``; the first ``sinks`` and the last ``window`` tokens are always
    kept, the rest of the budget goes to the highest scores (ties: the earlier token).
    """
    if scores.dim() != 3:
        raise KernelInputError(
            f"scores must be [layers, kv_heads, seq_len], got {tuple(scores.shape)}"
        )
    seq_len = scores.shape[-1]
    if budget < 0 or sinks < 0 or window < 0:
        raise KernelInputError("budget, sinks and window must be non-negative")
    if budget >= seq_len:
        heads = scores.shape[1] if per_head else 1
        return (
            torch.arange(seq_len, device=scores.device)
            .expand(scores.shape[0], heads, seq_len)
            .clone()
        )
    if sinks + window > budget:
        raise KernelInputError(f"sinks ({sinks}) + window ({window}) exceed the budget ({budget})")
    rows = scores if per_head else scores.mean(dim=1, keepdim=True)
    forced = torch.zeros(seq_len, dtype=torch.bool, device=scores.device)
    forced[:sinks] = True
    forced[seq_len - window :] = True
    middle = rows.masked_fill(forced, float("-inf"))
    # A stable top-k: sort by score descending, earlier positions first among equals.
    order = torch.sort(middle, dim=-1, descending=True, stable=True).indices
    chosen = order[..., : budget - int(forced.sum())]
    keep = forced.expand_as(rows).clone()
    keep.scatter_(-1, chosen, True)
    return keep.nonzero()[:, 2].view(rows.shape[0], rows.shape[1], budget)
