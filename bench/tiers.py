"""Fast tier vs full tier of the embedded default: speed and quality retention, in one run.

    python -m bench.tiers [--modes lossy,lossless] [--remove 4] [--heal-steps 400] [--url URL]
        [--quick]

For each fast-tier mode it starts ``gearshift serve`` (embedded stack, its own ports) — for
``lossy`` twice, without healing and with it (the embedded defaults unless given) — and sends
the same prompts to both tiers (pinned by model name, greedy decoding):

* decode speed on natural answers (each question below, asked to explain itself; answers
  stop on their own): streamed tokens per second after the first token at concurrency 1, and
  total tokens per second four requests at a time; ``speedup_c1``/``speedup_c4`` = fast / full,
  pooled over ``--rounds`` (3) rounds, after one unmeasured warm-up round, in which the two
  tiers take turns prompt by prompt (each round's own ratios are listed too);
* exact-answer questions (answer must contain the expected text), greedy agreement with the
  full tier (identical completions), and forced tool calls (``tool_choice`` naming the
  function, strict schema; the arguments must parse and name the expected value);
  ``quality_retention`` = fast's correct answers + tool passes over the full tier's.

Each run started here also names the fast build it measured (``fast_build``: model folder,
weights' SHA-256, pruning report's perplexities): two builds of the same settings are not
the same tier (docs/fast-tier.md). ``--url`` measures an already running gateway instead
(one mode, as configured there). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from bench.stack import embedded_stack, free_port
from gateway.config import EmbeddedSettings

FULL, FAST = "full", "fast"
QUESTIONS = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Canada?", "Ottawa"),
    ("What is the largest planet in the solar system?", "Jupiter"),
    ("Which planet is known as the Red Planet?", "Mars"),
    ("What gas do plants absorb from the air for photosynthesis?", "carbon dioxide"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
    ("What is the chemical symbol for water?", "H2O"),
    ("How many days are there in a week?", "seven"),
    ("What is the freezing point of water in degrees Celsius?", "0"),
    ("What is 2 + 2?", "4"),
    ("What colour is the sky on a clear day?", "blue"),
    ("What is the opposite of hot?", "cold"),
    ("Which animal is known as the king of the jungle?", "lion"),
    ("What is the tallest mountain in the world?", "Everest"),
    ("In which country are the pyramids of Giza?", "Egypt"),
]
TOOL_TASKS = [
    ("What's the weather like in Paris right now?", "get_weather", "city", "Paris"),
    ("Tell me the current weather in Tokyo.", "get_weather", "city", "Tokyo"),
    ("Is it raining in London?", "get_weather", "city", "London"),
    ("Weather report for Madrid, please.", "get_weather", "city", "Madrid"),
    ("Send an email to alice@example.com saying hello.", "send_email", "to", "alice@example.com"),
    ("Email bob@example.com about the meeting.", "send_email", "to", "bob@example.com"),
    ("Look up the stock price of AAPL.", "get_stock_price", "symbol", "AAPL"),
    ("What is MSFT trading at?", "get_stock_price", "symbol", "MSFT"),
]
TOOLS = {
    "get_weather": {"city": {"type": "string", "description": "city name"}},
    "send_email": {
        "to": {"type": "string", "description": "recipient address"},
        "body": {"type": "string"},
    },
    "get_stock_price": {"symbol": {"type": "string", "description": "ticker symbol"}},
}


def tool_spec(name: str) -> dict[str, Any]:
    props = TOOLS[name]
    return {
        "type": "function",
        "function": {
            "name": name,
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": props,
                "required": list(props),
                "additionalProperties": False,
            },
        },
    }


async def chat(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        data: dict[str, Any] = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{resp.status}: {data}")
        return data


async def stream_speed(
    session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int
) -> tuple[int, float, float]:
    """(tokens, seconds to first token, seconds from first to last token) of one streamed answer."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    started = time.perf_counter()
    first = last = None
    tokens = 0
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            elif event.get("choices") and event["choices"][0]["delta"].get("content"):
                now = time.perf_counter()
                first = first or now
                last = now
    assert first is not None and last is not None, "no content streamed"
    return tokens, first - started, last - first


def _decode_rate(runs: list[tuple[int, float, float]]) -> float:
    """Tokens after the first, over the time they took, pooled over the prompts."""
    return sum(n - 1 for n, _, _ in runs) / sum(dt for _, _, dt in runs)


async def speeds(
    session: aiohttp.ClientSession,
    url: str,
    max_tokens: int,
    rounds: int,
    questions: list[tuple[str, str]] = QUESTIONS,
) -> tuple[dict[str, dict[str, float]], list[dict[str, float]]]:
    """Decode speed of both tiers on natural answers to the question set (they stop on their
    own, at most ``max_tokens``): each prompt alone (concurrency 1), then the prompts four at
    a time. Interleaved: every prompt and every batch goes to one tier and then the other,
    the order alternating, ``rounds`` times over, so both tiers run under the same load on
    a shared machine and a burst of noise hits both rather than one tier's whole
    measurement. Greedy answers repeat exactly, so every round measures the same work. One
    more round runs first, unmeasured: a freshly started tier runs slower on its first
    answers of each kind (the first of three measured rounds once came out at 1.41x against
    1.92x and 1.93x for the next two), a first-use cost a serving tier has long paid.
    Returns the pooled figures per tier and the speedups of each round."""
    prompts = [f"{q} Explain your answer in a short paragraph." for q, _ in questions]
    sequential: dict[str, list[tuple[int, float, float]]] = {FULL: [], FAST: []}
    batched = {FULL: [0, 0.0], FAST: [0, 0.0]}  # tokens, seconds
    per_round: list[dict[str, float]] = []
    for r in range(rounds + 1):  # round 0 warms up
        seq_round: dict[str, list[tuple[int, float, float]]] = {FULL: [], FAST: []}
        batch_round = {FULL: [0, 0.0], FAST: [0, 0.0]}
        for i, prompt in enumerate(prompts):
            for model in (FULL, FAST) if (i + r) % 2 == 0 else (FAST, FULL):
                seq_round[model].append(await stream_speed(session, url, model, prompt, max_tokens))
        for i in range(0, len(prompts), 4):
            for model in (FULL, FAST) if (i // 4 + r) % 2 == 0 else (FAST, FULL):
                started = time.perf_counter()
                batch = await asyncio.gather(
                    *(stream_speed(session, url, model, p, max_tokens) for p in prompts[i : i + 4])
                )
                batch_round[model][0] += sum(n for n, _, _ in batch)
                batch_round[model][1] += time.perf_counter() - started
        if r == 0:
            continue
        for model in (FULL, FAST):
            sequential[model] += seq_round[model]
            batched[model][0] += batch_round[model][0]
            batched[model][1] += batch_round[model][1]
        per_round.append({
            "speedup_c1": round(_decode_rate(seq_round[FAST]) / _decode_rate(seq_round[FULL]), 2),
            "speedup_c4": round((batch_round[FAST][0] / batch_round[FAST][1])
                                / (batch_round[FULL][0] / batch_round[FULL][1]), 2),
        })  # fmt: skip
    tiers = {
        model: {
            "tok_s_c1": round(_decode_rate(sequential[model]), 1),
            "tok_s_c4": round(batched[model][0] / batched[model][1], 1),
            "tokens_c1": sum(n for n, _, _ in sequential[model]) // rounds,  # one round's answers
        }
        for model in (FULL, FAST)
    }
    return tiers, per_round


async def quality(
    session: aiohttp.ClientSession,
    url: str,
    questions: list[tuple[str, str]] = QUESTIONS,
    tool_tasks: list[tuple[str, str, str, str]] = TOOL_TASKS,
) -> dict[str, Any]:
    answers: dict[str, list[str]] = {FULL: [], FAST: []}
    correct = {FULL: 0, FAST: 0}
    for question, expected in questions:
        for model in (FULL, FAST):
            data = await chat(session, url, {"model": model, "messages": [{"role": "user", "content": question}],
                                              "max_tokens": 48, "temperature": 0})  # fmt: skip
            text = data["choices"][0]["message"]["content"] or ""
            answers[model].append(text)
            correct[model] += expected.lower() in text.lower()
    agreement = sum(a == b for a, b in zip(answers[FULL], answers[FAST], strict=True)) / len(
        questions
    )
    tools = {FULL: 0, FAST: 0}
    for prompt, name, arg, value in tool_tasks:
        for model in (FULL, FAST):
            body = {"model": model, "messages": [{"role": "user", "content": prompt}], "tools": [tool_spec(name)],
                    "tool_choice": {"type": "function", "function": {"name": name}}, "max_tokens": 64, "temperature": 0}  # fmt: skip
            data = await chat(session, url, body)
            calls = data["choices"][0]["message"].get("tool_calls") or []
            try:
                args = json.loads(calls[0]["function"]["arguments"]) if calls else {}
            except json.JSONDecodeError:
                args = {}
            tools[model] += str(args.get(arg, "")).lower() == value.lower()
    full_score = correct[FULL] + tools[FULL]
    return {
        "exact_full": correct[FULL], "exact_fast": correct[FAST], "exact_total": len(questions),
        "tool_full": tools[FULL], "tool_fast": tools[FAST], "tool_total": len(tool_tasks),
        "greedy_agreement": round(agreement, 3),
        "quality_retention": round((correct[FAST] + tools[FAST]) / full_score, 3) if full_score else None,
    }  # fmt: skip


async def measure(
    url: str, max_tokens: int, rounds: int = 3, quick: bool = False
) -> dict[str, Any]:
    """Speeds and quality; ``quick``: 2 questions and 1 tool task (a smoke run)."""
    questions, tool_tasks = (QUESTIONS[:2], TOOL_TASKS[:1]) if quick else (QUESTIONS, TOOL_TASKS)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        tiers, per_round = await speeds(session, url, max_tokens, rounds, questions)
        q = await quality(session, url, questions, tool_tasks)
    full, fast = tiers[FULL], tiers[FAST]
    return {"full": full, "fast": fast, "speedup_c1": round(fast["tok_s_c1"] / full["tok_s_c1"], 2),
            "speedup_c4": round(fast["tok_s_c4"] / full["tok_s_c4"], 2),
            "speedup_c1_rounds": [r["speedup_c1"] for r in per_round],
            "speedup_c4_rounds": [r["speedup_c4"] for r in per_round], **q}  # fmt: skip


def served_build(url: str) -> dict[str, Any]:
    """Which weights a vLLM server at ``url`` serves: its model folder (the ``root`` of its
    ``/v1/models``), the first 12 hex digits of the SHA-256 of its safetensors, and the
    perplexities of its pruning report. Two builds of the same settings differ (vLLM's
    sampling of the healing conversations is not reproducible across machines), and so do
    their speeds: a figure is traceable to the build it was measured on (docs/fast-tier.md)."""
    with urllib.request.urlopen(url + "/v1/models", timeout=30) as resp:
        root = Path(json.load(resp)["data"][0]["root"])
    digest = hashlib.sha256()
    for weights in sorted(root.glob("*.safetensors")):
        with weights.open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    report = root / "gearshift-prune.json"
    perplexity = json.loads(report.read_text()).get("perplexity") if report.exists() else None
    return {
        "model_dir": str(root),
        "weights_sha256": digest.hexdigest()[:12],
        "perplexity": perplexity,
    }


def run_stack(
    mode: str,
    heal_steps: int,
    remove: int,
    max_tokens: int,
    overrides: dict[str, int | str],
    rounds: int = 3,
    quick: bool = False,
) -> dict[str, Any]:
    env = {"GEARSHIFT_EMBEDDED__FAST_MODE": mode, "GEARSHIFT_EMBEDDED__HEAL_STEPS": str(heal_steps),
           "GEARSHIFT_EMBEDDED__PRUNE_REMOVE": str(remove),
           **{f"GEARSHIFT_EMBEDDED__{k.upper()}": str(v) for k, v in overrides.items()}}  # fmt: skip
    fast_port = free_port()
    with embedded_stack(env, f"[{mode}, heal {heal_steps}] ", fast_port=fast_port) as url:
        result = asyncio.run(measure(url, max_tokens, rounds, quick))
        result["fast_build"] = served_build(f"http://127.0.0.1:{fast_port}")
    result.update({"mode": mode, "heal_steps": heal_steps, "layers_removed": remove, **overrides})
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--modes", default="lossy,lossless")
    default = EmbeddedSettings()
    parser.add_argument(
        "--heal-steps", type=int, default=default.heal_steps, help="embedded.heal_steps"
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument(
        "--rounds", type=int, default=3,
        help="speed rounds, both tiers interleaved in each (the speedups pool them)",
    )  # fmt: skip
    parser.add_argument(
        "--remove", type=int, default=default.prune_remove, help="embedded.prune_remove"
    )
    parser.add_argument(
        "--skip-unhealed", action="store_true", help="lossy: do not also measure before healing"
    )
    parser.add_argument(
        "--speculative-tokens", type=int, help="embedded.speculative_tokens (default: the mode's)"
    )
    parser.add_argument("--ngram-min", type=int, help="embedded.ngram_min (default 2)")
    parser.add_argument("--ngram-max", type=int, help="embedded.ngram_max (default 4)")
    parser.add_argument(
        "--heal-data",
        choices=["calibration", "self"],
        help=f"embedded.heal_data (default {default.heal_data})",
    )
    parser.add_argument(
        "--heal-samples", type=int, help=f"embedded.heal_samples (default {default.heal_samples})"
    )
    parser.add_argument("--url", help="measure a running gateway instead of starting stacks")
    parser.add_argument(
        "--quick", action="store_true",
        help="the default (lossy, healed) stack only, one round of 2 questions at most 16 "
        "tokens, 1 tool task: a smoke run",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.modes, args.skip_unhealed, args.rounds, args.max_tokens = "lossy", True, 1, 16
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    overrides = {
        k: v
        for k, v in (("speculative_tokens", args.speculative_tokens),
                     ("ngram_min", args.ngram_min), ("ngram_max", args.ngram_max),
                     ("heal_data", args.heal_data), ("heal_samples", args.heal_samples))
        if v is not None
    }  # fmt: skip
    if args.url:
        url = args.url.rstrip("/")
        runs = [asyncio.run(measure(url, args.max_tokens, args.rounds, args.quick))]
    else:
        runs = []
        for mode in args.modes.split(","):
            if mode == "lossy" and args.heal_steps and not args.skip_unhealed:
                unhealed = {k: v for k, v in overrides.items() if not k.startswith("heal_")}
                runs.append(run_stack(mode, 0, args.remove, args.max_tokens, unhealed, args.rounds))
            how = (args.max_tokens, overrides, args.rounds, args.quick)
            runs.append(run_stack(mode, args.heal_steps, args.remove, *how))
    headline = next((r for r in reversed(runs) if r.get("mode") == "lossy"), runs[-1])
    summary = {
        k: headline[k]
        for k in ("speedup_c1", "speedup_c4", "quality_retention", "greedy_agreement")
    }
    print(json.dumps({**summary, "runs": runs}))


if __name__ == "__main__":
    main()
