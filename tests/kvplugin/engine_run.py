"""Run inside the engine environment: a tiny random Llama through vLLM with KV compaction,
next to a pure-torch reference of the same model and the same compaction.

argv: tokenizer dir, work dir, JSON of the run (compaction settings, prompt lengths,
max_tokens). Prints one JSON line: per request vLLM's tokens and top logprobs and the
reference's log-probabilities for them, the compaction traces, and the KV pool's free
blocks before, after the compactions and at the end.
"""

import json
import math
import os
import shutil
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

tokenizer_dir, work, run = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
cfg = run["compaction"]
model_dir = work / "tiny-llama"
if not (model_dir / "model.safetensors").exists():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=2048,
        tie_word_embeddings=True, torch_dtype="float32",
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger logits than the default init, so attention is not flat
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
            layer.self_attn.k_proj.weight.mul_(8)
    model.save_pretrained(model_dir)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / f, model_dir / f)

trace_path = work / "trace.jsonl"
trace_path.unlink(missing_ok=True)
os.environ.update({
    "GEARSHIFT_KV_COMPACTION": json.dumps(cfg), "GEARSHIFT_KV_COMPACTION_TRACE": str(trace_path),
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
    "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
})  # fmt: skip

from vllm import LLM, SamplingParams  # noqa: E402  (after the environment is set)
from vllm.inputs import TokensPrompt  # noqa: E402

llm = LLM(
    model=str(model_dir), dtype="float32", enforce_eager=True, max_model_len=run.get("max_model_len", 1024),
    max_num_batched_tokens=2048, enable_chunked_prefill=False, block_size=32,
    kv_cache_memory_bytes=run.get("kv_bytes", 4 << 20), scheduler_cls=run["scheduler_cls"],
    async_scheduling=run["scheduler_cls"].endswith("AsyncScheduler"),
    enable_prefix_caching=True, seed=0,
)  # fmt: skip
scheduler = llm.llm_engine.engine_core.engine_core.scheduler
pool = scheduler.kv_cache_manager.block_pool
free_start = pool.get_num_free_blocks()

# "batches": lists of prompts generated together, batch after batch; a prompt is a length,
# or [length, index of an earlier prompt, tokens of it to start with] (prefix sharing)
g = torch.Generator().manual_seed(1)
prompts, outs, ids = [], [], []
params = SamplingParams(max_tokens=run["max_tokens"], temperature=0.0, logprobs=5, ignore_eos=True)
for batch in run["batches"]:
    new = []
    for spec in batch:
        n, source, shared = (spec, 0, 0) if isinstance(spec, int) else spec
        tokens = torch.randint(100, 49000, (n,), generator=g).tolist()
        new.append(((prompts + new)[source][:shared] if shared else []) + tokens[shared:])
    prompts += new
    outs += llm.generate([TokensPrompt(prompt_token_ids=p) for p in new], params, use_tqdm=False)
free_end = pool.get_num_free_blocks()
traces = (
    [json.loads(line) for line in trace_path.read_text().splitlines()]
    if trace_path.exists()
    else []
)
# vLLM's engine suffixes the request ids it is given ("3" -> "3-9a2970be")
for t in traces:
    t["request"] = t["request"].rsplit("-", 1)[0]
compacted = {t["request"] for t in traces if t["side"] == "worker"}

# ---- the pure-torch reference: the same model, a dense cache, the same selection rule ----
W = load_file(str(model_dir / "model.safetensors"))
hc = json.loads((model_dir / "config.json").read_text())
H, KVH, D = hc["num_attention_heads"], hc["num_key_value_heads"], hc["head_dim"]
theta = hc.get("rope_theta") or hc.get("rope_parameters", {}).get("rope_theta", 10000.0)
emb = W["model.embed_tokens.weight"]


def rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + hc["rms_norm_eps"]) * w


def rope(x, pos):  # x [T, heads, D], neox style (rotate halves)
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = pos[:, None].double() * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).float(), torch.cat([ang.sin()] * 2, -1).float()
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]


def attend(q, k, v, q_pos, k_pos):  # q [Tq,H,D], k/v [Tk,KVH,D]
    k, v = k.repeat_interleave(H // KVH, 1), v.repeat_interleave(H // KVH, 1)
    logits = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    logits = logits.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(logits, -1), v)


def step(ids, pos, cache):
    """Forward ``ids`` at RoPE positions ``pos`` over ``cache`` (per layer: K, V, their
    positions), appending the new keys. Returns logits and the post-RoPE queries."""
    x, queries = emb[ids], []
    for i, (k_c, v_c, p_c) in enumerate(cache):
        p = f"model.layers.{i}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = rope((h @ W[p + "self_attn.q_proj.weight"].T).view(-1, H, D), pos)
        k = rope((h @ W[p + "self_attn.k_proj.weight"].T).view(-1, KVH, D), pos)
        v = (h @ W[p + "self_attn.v_proj.weight"].T).view(-1, KVH, D)
        cache[i] = (torch.cat([k_c, k]), torch.cat([v_c, v]), torch.cat([p_c, pos]))
        o = attend(q, *cache[i][:2], pos, cache[i][2])
        x = x + o.reshape(len(ids), H * D) @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        gate = F.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)
        x = x + gate @ W[p + "mlp.down_proj.weight"].T
        queries.append(q)
    return rms(x, W["model.norm.weight"]) @ emb.T, queries


def select(k, q_window, keep):
    """SnapKV as the docs describe it, written out: window softmax mass per key, summed over
    the window and the query heads of each KV head, max-pooled over 7, averaged over KV
    heads; sinks and the window forced in; the top scores (earlier first on ties)."""
    T, w = k.shape[0], q_window.shape[0]
    kk = k.repeat_interleave(H // KVH, 1)
    logits = torch.einsum("qhd,khd->hqk", q_window, kk) / math.sqrt(D)
    q_pos = torch.arange(T - w, T)
    logits = logits.masked_fill(torch.arange(T)[None, None] > q_pos[None, :, None], float("-inf"))
    mass = torch.softmax(logits, -1).sum(1).view(KVH, H // KVH, T).sum(1)
    pooled = F.max_pool1d(mass[:, None], 7, stride=1, padding=3)[:, 0].mean(0)
    forced = torch.zeros(T, dtype=torch.bool)
    forced[: cfg["sinks"]] = True
    forced[T - w :] = True
    order = torch.sort(
        pooled.masked_fill(forced, float("-inf")), descending=True, stable=True
    ).indices
    chosen = set(order[: keep - int(forced.sum())].tolist()) | set(forced.nonzero()[:, 0].tolist())
    return sorted(chosen)


results = []


def empty():
    none = (torch.empty(0, KVH, D), torch.empty(0, KVH, D), torch.empty(0, dtype=torch.long))
    return [none for _ in range(hc["num_hidden_layers"])]


for prompt, out in zip(prompts, outs, strict=True):
    tokens = out.outputs[0].token_ids
    T = len(prompt)
    with torch.no_grad():
        full, comp = empty(), empty()
        logits_full, queries = step(torch.tensor(prompt), torch.arange(T), full)
        comp = [tuple(t.clone() for t in layer) for layer in full]
        keep = min(cfg["budget"], T) if out.request_id in compacted else T
        kept = []
        for i in range(len(comp)):
            sel = (
                select(comp[i][0], queries[i][-cfg["window"] :], keep)
                if keep < T
                else list(range(T))
            )
            kept.append(sel)
            idx = torch.tensor(sel)
            comp[i] = (comp[i][0][idx], comp[i][1][idx], comp[i][2][idx])
        ref_full, ref_comp = [logits_full[-1]], [logits_full[-1]]
        for j, tok in enumerate(tokens[:-1]):
            pos = torch.tensor([T + j])
            ref_full.append(step(torch.tensor([tok]), pos, full)[0][-1])
            ref_comp.append(step(torch.tensor([tok]), pos, comp)[0][-1])
    steps = []
    for j, lp in enumerate(out.outputs[0].logprobs):
        ids = sorted(lp)
        steps.append({
            "vllm": [lp[t].logprob for t in ids],
            "ref_compacted": torch.log_softmax(ref_comp[j], -1)[ids].tolist(),
            "ref_full": torch.log_softmax(ref_full[j], -1)[ids].tolist(),
        })  # fmt: skip
    results.append({"request": out.request_id, "prompt_tokens": T, "tokens": list(tokens),
                    "compacted": out.request_id in compacted,
                    "ref_kept": kept, "steps": steps})  # fmt: skip

print(json.dumps({"results": results, "traces": traces, "free_start": free_start,
                  "free_end": free_end, "block_size": 32}))  # fmt: skip
