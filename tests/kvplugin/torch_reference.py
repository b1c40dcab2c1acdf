"""A pure-torch reference of the tiny Llama that engine_session.py runs through vLLM: the
same weights, a dense cache, and the compaction rule written out (no vLLM, no kernels).

Run in the engine's environment (imported by engine_session.py, from its own directory).
"""

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class Reference:
    def __init__(self, model_dir: Path, compaction: dict[str, Any]) -> None:
        self.W = load_file(str(model_dir / "model.safetensors"))
        self.hc = hc = json.loads((model_dir / "config.json").read_text())
        self.H, self.KVH, self.D = (
            hc["num_attention_heads"], hc["num_key_value_heads"], hc["head_dim"],
        )  # fmt: skip
        rope = hc.get("rope_parameters") or {}
        self.theta = hc.get("rope_theta") or rope.get("rope_theta", 10000.0)
        self.emb = self.W["model.embed_tokens.weight"]
        self.cfg = compaction

    def rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.hc["rms_norm_eps"]) * w

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D], neox style (rotate halves)."""
        D = self.D
        inv = 1.0 / self.theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = pos[:, None].double() * inv[None]
        cos, sin = torch.cat([ang.cos()] * 2, -1).float(), torch.cat([ang.sin()] * 2, -1).float()
        x1, x2 = x[..., : D // 2], x[..., D // 2 :]
        return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]

    def attend(self, q, k, v, q_pos, k_pos):  # type: ignore[no-untyped-def]
        """q [Tq, H, D], k/v [Tk, KVH, D]."""
        g = self.H // self.KVH
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        logits = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(self.D)
        logits = logits.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        return torch.einsum("hqk,khd->qhd", torch.softmax(logits, -1), v)

    def empty(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        e = torch.empty(0, self.KVH, self.D)
        return [(e, e, torch.empty(0, dtype=torch.long))] * self.hc["num_hidden_layers"]

    def step(self, ids, pos, cache):  # type: ignore[no-untyped-def]
        """Forward ``ids`` at RoPE positions ``pos`` over ``cache`` (per layer: K, V, their
        positions), appending the new keys. Returns logits and the post-RoPE queries."""
        W, H, KVH, D = self.W, self.H, self.KVH, self.D
        x, queries = self.emb[ids], []
        for i, (k_c, v_c, p_c) in enumerate(cache):
            p = f"model.layers.{i}."
            h = self.rms(x, W[p + "input_layernorm.weight"])
            q = self.rope((h @ W[p + "self_attn.q_proj.weight"].T).view(-1, H, D), pos)
            k = self.rope((h @ W[p + "self_attn.k_proj.weight"].T).view(-1, KVH, D), pos)
            v = (h @ W[p + "self_attn.v_proj.weight"].T).view(-1, KVH, D)
            cache[i] = (torch.cat([k_c, k]), torch.cat([v_c, v]), torch.cat([p_c, pos]))
            o = self.attend(q, *cache[i][:2], pos, cache[i][2])
            x = x + o.reshape(len(ids), H * D) @ W[p + "self_attn.o_proj.weight"].T
            h = self.rms(x, W[p + "post_attention_layernorm.weight"])
            up = h @ W[p + "mlp.up_proj.weight"].T
            gate = F.silu(h @ W[p + "mlp.gate_proj.weight"].T) * up
            x = x + gate @ W[p + "mlp.down_proj.weight"].T
            queries.append(q)
        return self.rms(x, W["model.norm.weight"]) @ self.emb.T, queries

    def select(self, k: torch.Tensor, q_window: torch.Tensor, keep: int) -> list[int]:
        """SnapKV as the docs describe it, written out: window softmax mass per key, summed
        over the window and the query heads of each KV head, max-pooled over 7, averaged
        over KV heads; sinks and the window forced in; the top scores (earlier first on
        ties)."""
        H, KVH = self.H, self.KVH
        T, w = k.shape[0], q_window.shape[0]
        kk = k.repeat_interleave(H // KVH, 1)
        logits = torch.einsum("qhd,khd->hqk", q_window, kk) / math.sqrt(self.D)
        q_pos = torch.arange(T - w, T)
        future = torch.arange(T)[None, None] > q_pos[None, :, None]
        logits = logits.masked_fill(future, float("-inf"))
        mass = torch.softmax(logits, -1).sum(1).view(KVH, H // KVH, T).sum(1)
        pooled = F.max_pool1d(mass[:, None], 7, stride=1, padding=3)[:, 0].mean(0)
        forced = torch.zeros(T, dtype=torch.bool)
        forced[: self.cfg["sinks"]] = True
        forced[T - w :] = True
        scores = pooled.masked_fill(forced, float("-inf"))
        order = torch.sort(scores, descending=True, stable=True).indices
        chosen = set(order[: keep - int(forced.sum())].tolist())
        return sorted(chosen | set(forced.nonzero()[:, 0].tolist()))

    @torch.no_grad()
    def follow(
        self, prompt: list[int], tokens: list[int], compaction: tuple[int, int] | None
    ) -> dict[str, Any]:
        """The full-cache and the compacted reference's logits along vLLM's tokens, and the
        prompt positions the compacted one keeps in each layer. ``compaction``: (prompt
        tokens kept, tokens in the cache when it is compacted), None for a full cache."""
        T = len(prompt)
        full = self.empty()
        logits, queries = self.step(torch.tensor(prompt), torch.arange(T), full)
        windows = [q[-self.cfg["window"] :] for q in queries]
        comp = [tuple(t.clone() for t in layer) for layer in full]
        kept = [list(range(T))] * len(comp)

        def compact_when(length: int) -> None:
            """SnapKV over the prompt when the cache holds ``length`` tokens; the tokens
            decoded since are kept."""
            nonlocal kept
            if compaction is None or compaction[1] != length:
                return
            keep = compaction[0]
            kept = [self.select(c[0][:T], w, keep) for c, w in zip(comp, windows, strict=True)]
            for i, sel in enumerate(kept):
                idx = torch.tensor(sel + list(range(T, length)))
                comp[i] = tuple(t[idx] for t in comp[i])

        compact_when(T)
        ref_full, ref_comp = [logits[-1]], [logits[-1]]
        for j, tok in enumerate(tokens[:-1]):
            pos = torch.tensor([T + j])
            ref_full.append(self.step(torch.tensor([tok]), pos, full)[0][-1])
            ref_comp.append(self.step(torch.tensor([tok]), pos, comp)[0][-1])
            compact_when(T + j + 1)
        return {"kept": kept, "full": ref_full, "compacted": ref_comp}
