"""KV compaction on the real embedded stack: the full tier compacts long prompts
(`embedded.kv_compaction.full`), answers keep coming, and requests next to them are
unaffected."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import openai
import pytest

from gateway.config import EmbeddedSettings
from tests.e2e.conftest import RealStack, start_stack

pytestmark = pytest.mark.e2e

SHORT = [{"role": "user", "content": "What is the capital of France?"}]


def history(seed: int, lines: int = 60) -> str:
    """Agent-like history: tool outputs, log lines, code; about 27 tokens a line (60 lines: 1.6k)."""
    parts = []
    for i in range(lines):
        kind = (i + seed) % 3
        if kind == 0:
            parts.append(f"[tool:run_shell] exit=0 stdout: file_{seed}_{i}.py 4{i % 10}2 bytes ok")
        elif kind == 1:
            parts.append(
                f"2026-12-01T10:{i % 60:02d}:00 INFO worker-{seed} step {i} done in {i * 7 % 97} ms"
            )
        else:
            parts.append(f"def handler_{seed}_{i}(x): return x * {i % 13} + {seed}")
    return "\n".join(parts)


def ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text + "\n\nSummarise the history above in one line."}]


@pytest.fixture(scope="module")
def compacting_stack(tmp_path_factory: pytest.TempPathFactory):
    with start_stack(
        tmp_path_factory.mktemp("kv"),
        kv_compaction__full__enabled="true",
        kv_compaction__full__trigger_tokens="1024",
        kv_compaction__full__budget="0.5",
    ) as stack:
        yield stack


def full_log(stack: RealStack) -> str:
    port = urlparse(stack.full_url).port
    return (EmbeddedSettings().home / "logs" / f"vllm-full-{port}.log").read_text(errors="replace")


def test_long_prompts_are_compacted_and_answered(compacting_stack: RealStack) -> None:
    # a 1.6k-token prefill takes about a minute on one shared AVX2 core
    client = openai.OpenAI(
        base_url=compacting_stack.url + "/v1", api_key="unused", max_retries=0, timeout=600
    )

    def chat(messages: list[dict[str, str]]) -> str:
        answer = client.chat.completions.create(
            model="full",
            messages=messages,
            max_tokens=24,
            temperature=0,  # type: ignore[arg-type]
        )
        text = answer.choices[0].message.content
        assert text, answer
        return text

    short_alone = chat(SHORT)
    first = history(1)
    with ThreadPoolExecutor(3) as pool:  # two long prompts and a short one at once
        answers = list(pool.map(chat, [ask(first), ask(history(2)), SHORT]))
    assert answers[2] == short_alone  # the uncompacted neighbour is unaffected
    # a prompt sharing the first one's prefix, then the first one again: the compacted
    # blocks never entered the prefix cache, so the repeat is compacted the same way
    chat(ask(first + "\n" + history(3, 20)))
    assert chat(ask(first)) == answers[0]
    log = full_log(compacting_stack)
    kept = [
        (int(k), int(n))
        for k, n in re.findall(r"KV compaction: request \S+ keeps (\d+) of (\d+) prompt", log)
    ]
    assert len(kept) >= 4, log[-3000:]
    assert all(n > 1024 and k == -(-n // 2) for k, n in kept)
    assert "compacted" in log and "Traceback" not in log
