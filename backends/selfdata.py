"""Conversations written by a model itself, to heal its pruned variant on (``--heal-data self``).

Run in the engine environment (it needs vLLM); ``gearshift prune --heal-data self`` calls it,
``python -m backends.selfdata SRC OUT.jsonl --samples N`` works on its own.

No data leaves or enters the machine: the full model writes the user turns too. Its chat
template is rendered up to the start of a user turn and the model continues from there, as
an aligned chat model writes the kind of request it was tuned on (Magpie, Xu et al.,
arXiv 2406.08464); then it answers each request greedily, as the full tier would. Requests or
answers that run into the token limit (small models loop) and duplicates are dropped, so the
file holds only exchanges that ended on their own. The output is JSONL of
``{"messages": [...]}``, the calibration format, to read, edit or pass as ``--heal-data FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

SENTINEL = "\u2063gearshift-user-turn\u2063"
MAX_ROUNDS = 4
REQUEST_TOKENS = 96  # longer requests are mostly a small model rambling
OVERSAMPLE = 3  # on the 135M default, 3 of 4 requests and half the answers end on their own


class SelfDataError(RuntimeError):
    """The model cannot write its own conversations as asked."""


def user_turn_prefix(tokenizer: Any) -> str:
    """The rendered chat up to where a user's words begin (system turn included)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False)
    if SENTINEL not in text:
        raise SelfDataError("the chat template does not render the user's message as given")
    return str(text.split(SENTINEL, 1)[0])


def keep(texts: list[tuple[str, str]], seen: set[str], min_chars: int = 8) -> list[str]:
    """Texts that ended on their own (``finish_reason == 'stop'``), long enough and new."""
    kept = []
    for text, reason in texts:
        text = text.strip()
        if reason == "stop" and len(text) >= min_chars and text not in seen:
            seen.add(text)
            kept.append(text)
    return kept


def engine_env() -> None:
    """Offline, no telemetry, and no CPU held back: vLLM's automatic binding reserves one
    CPU for the frontend unless told otherwise, half of a 2-core machine. Set before vLLM
    is imported (it reads them then); values the caller set win."""
    from backends.vllm_server import BASE_ENV

    for key, value in BASE_ENV.items():
        os.environ.setdefault(key, value)


def generate(
    src: Path, samples: int, seed: int, max_tokens: int, progress: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    engine_env()
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(src), dtype="bfloat16", max_model_len=REQUEST_TOKENS + max_tokens + 256, seed=seed,
        enforce_eager=True, disable_log_stats=True, kv_cache_memory_bytes=1 << 30,
    )  # fmt: skip
    tokenizer = llm.get_tokenizer()
    prefix = user_turn_prefix(tokenizer)
    # no per-request seed: every request here has the same prompt, and would get one text
    ask = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=REQUEST_TOKENS)
    answer = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    conversations: list[dict[str, Any]] = []
    seen: set[str] = set()
    stats = {"requests_written": 0, "requests_kept": 0, "answers_kept": 0}
    for _ in range(MAX_ROUNDS):
        wanted = samples - len(conversations)
        if wanted <= 0:
            break
        outs = llm.generate([prefix] * (OVERSAMPLE * wanted), ask, use_tqdm=progress)
        requests = keep([(o.outputs[0].text, o.outputs[0].finish_reason) for o in outs], seen)
        stats["requests_written"] += len(outs)
        stats["requests_kept"] += len(requests)
        chats = [[{"role": "user", "content": r}] for r in requests]
        outs = llm.chat(chats, answer, use_tqdm=progress, add_generation_prompt=True)
        for chat, out in zip(chats, outs, strict=True):
            done = out.outputs[0]
            if done.finish_reason == "stop" and done.text.strip() and len(conversations) < samples:
                conversations.append(
                    {"messages": [*chat, {"role": "assistant", "content": done.text.strip()}]}
                )
                stats["answers_kept"] += 1
    if len(conversations) < samples:
        raise SelfDataError(
            f"the model wrote only {len(conversations)} usable conversations of {samples} in "
            f"{MAX_ROUNDS} rounds ({stats}); ask for fewer or raise --max-tokens"
        )
    return conversations, stats


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m backends.selfdata",
        description="Have a chat model write conversations to heal its pruned variant on.",
    )
    p.add_argument("src", help="Hugging Face checkpoint folder with a chat template")
    p.add_argument("out", help="JSONL file to write ({'messages': [...]} per line)")
    p.add_argument("--samples", type=int, default=256, help="conversations to write")
    p.add_argument("--max-tokens", type=int, default=384, help="longest answer kept, in tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stats", help="also write the counts (JSON) to this file")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    # a terminated run unwinds, so vLLM shuts its engine process down instead of orphaning it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parser().parse_args(argv)
    if args.samples < 1 or args.max_tokens < 16:
        print("backends.selfdata: --samples must be ≥ 1 and --max-tokens ≥ 16", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        conversations, stats = generate(
            Path(args.src), args.samples, args.seed, args.max_tokens, not args.quiet
        )
    except SelfDataError as exc:
        print(f"backends.selfdata: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    tmp.write_text("".join(json.dumps(c) + "\n" for c in conversations))
    tmp.rename(out)
    summary = json.dumps({**stats, "seconds": round(time.monotonic() - started, 1)})
    if args.stats:
        Path(args.stats).write_text(summary)
    print(summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
