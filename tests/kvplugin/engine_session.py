"""Run inside the engine environment: a tiny random Llama through vLLM with KV compaction,
scenario after scenario on one engine per scheduler class, next to a pure-torch reference
of the same model and the same compaction (torch_reference.py).

argv: tokenizer dir, work dir, JSON of the session: {"compaction": settings, "engine":
LLM arguments shared by the engines, "engines": [{"scheduler_cls", "scenarios": [{"name",
"batches", "max_tokens"}]}]}. A batch is a list of prompts generated together; a prompt is
a length, or [length, index of an earlier prompt of the scenario, tokens of it to start
with] (prefix sharing). A scenario's "compaction" (optional) changes, for it, the settings the
scheduler reads (when and how much; never window or sinks, which the worker reads too). Prints one JSON line: per engine and scenario, per request vLLM's
tokens, top logprobs, kv_transfer_params and the references' log-probabilities for them,
the compaction traces, the KV pool's free blocks before and after, and what the plugin's
Prometheus counters gained.
"""

import gc
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from torch_reference import Reference
from transformers import LlamaConfig, LlamaForCausalLM

tokenizer_dir, work, session = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
cfg = session["compaction"]
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

from prometheus_client import REGISTRY  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402  (after the environment is set)
from vllm.inputs import TokensPrompt  # noqa: E402

from kvplugin.config import CompactionConfig  # noqa: E402
from kvplugin.metrics import COUNTERS, record_of  # noqa: E402

SCHEDULER_ONLY = {"trigger", "trigger_tokens", "budget", "high_watermark", "low_watermark"}

reference = Reference(model_dir, cfg)
g = torch.Generator().manual_seed(1)


def counters() -> dict[str, float]:
    return {n: REGISTRY.get_sample_value(n + "_total") or 0.0 for n in COUNTERS}


def read_traces(offset: int) -> tuple[list[dict[str, Any]], int]:
    if not trace_path.exists():
        return [], offset
    text = trace_path.read_text()
    traces = [json.loads(line) for line in text[offset:].splitlines()]
    for t in traces:  # vLLM's engine suffixes the request ids it is given ("3" -> "3-9a2970be")
        t["request"] = t["request"].rsplit("-", 1)[0]
    return traces, len(text)


def run_scenario(llm: Any, scenario: dict[str, Any], trace_offset: int) -> tuple[dict, int]:
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    pool, settings = scheduler.kv_cache_manager.block_pool, scheduler.kv_compaction
    override = scenario.get("compaction", {})
    assert set(override) <= SCHEDULER_ONLY, override
    scheduler.kv_compaction = CompactionConfig.from_mapping({**cfg, **override})
    free_before, counted = pool.get_num_free_blocks(), counters()
    params = SamplingParams(
        max_tokens=scenario["max_tokens"], temperature=0.0, logprobs=5, ignore_eos=True
    )
    prompts: list[list[int]] = []
    outs = []
    for batch in scenario["batches"]:
        new: list[list[int]] = []
        for spec in batch:
            n, source, shared = (spec, 0, 0) if isinstance(spec, int) else spec
            tokens = torch.randint(100, 49000, (n,), generator=g).tolist()
            new.append(((prompts + new)[source][:shared] if shared else []) + tokens[shared:])
        prompts += new
        outs += llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in new], params, use_tqdm=False
        )
    scheduler.kv_compaction = settings
    traces, trace_offset = read_traces(trace_offset)
    compacted = {t["request"] for t in traces if t["side"] == "worker"}
    orders = {
        t["request"]: (t["kept_tokens"], t["cached_tokens"])
        for t in traces if t["side"] == "scheduler"
    }  # fmt: skip
    results = []
    for prompt, out in zip(prompts, outs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        ref = reference.follow(prompt, tokens, orders.get(out.request_id))
        steps = []
        for j, lp in enumerate(out.outputs[0].logprobs):
            ids = sorted(lp)
            steps.append({
                "vllm": [lp[t].logprob for t in ids],
                "ref_compacted": torch.log_softmax(ref["compacted"][j], -1)[ids].tolist(),
                "ref_full": torch.log_softmax(ref["full"][j], -1)[ids].tolist(),
            })  # fmt: skip
        results.append({
            "request": out.request_id, "prompt_tokens": len(prompt), "tokens": tokens,
            "compacted": out.request_id in compacted, "ref_kept": ref["kept"], "steps": steps,
            "record": record_of(out.kv_transfer_params),
        })  # fmt: skip
    after = counters()
    return {
        "results": results, "traces": traces, "free_before": free_before,
        "free_after": pool.get_num_free_blocks(),
        "counters": {n: after[n] - counted[n] for n in COUNTERS},
    }, trace_offset  # fmt: skip


report: dict[str, Any] = {}
offset = 0
for engine in session["engines"]:
    name = engine["scheduler_cls"]
    llm = LLM(
        model=str(model_dir), dtype="float32", enforce_eager=True, enable_chunked_prefill=False,
        block_size=32, scheduler_cls=name, async_scheduling=name.endswith("AsyncScheduler"),
        enable_prefix_caching=True, seed=0, **session["engine"],
    )  # fmt: skip
    report[name] = {}
    for scenario in engine["scenarios"]:
        report[name][scenario["name"]], offset = run_scenario(llm, scenario, offset)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()

print(json.dumps(report))
