"""What ``bench.tiers`` asks: samples of the locked task split, and agent-like repetitive prompts.

* ``split_sample(side, per_family)``: the first ``per_family`` checkable tasks of every task
  family on one side of the locked split (``bench/data/router_split.json``; ``test`` is
  reported on, ``dev`` is what a lever may be chosen on), ordered by the hash of the request
  so the sample depends on the requests only.
* ``repetitive_bodies(n)``: requests whose answers mostly repeat the prompt, the shape of an
  agent loop's steps (rewrite a file with one rename, copy a JSON list with one change,
  quote the failing lines of a tool's log). Model-free speculation (ngram, suffix) is built
  for these; they are generated here from fixed seeds, no data file needed.
"""

from __future__ import annotations

import functools
import json
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from bench.router_split import body_hash, family
from bench.router_split import load as load_split
from bench.router_tasks import Task, all_tasks

# HumanEval's checker runs candidates in the bubblewrap sandbox: a quick run leaves it out
NO_SANDBOX_SOURCES = ("bfcl", "reasoning_gym", "trivia")


@functools.cache
def _checkable() -> tuple[Task, ...]:
    return tuple(t for t in all_tasks() if t.check is not None)


def split_tasks(side: str, sources: Sequence[str] | None = None) -> list[Task]:
    """The checkable tasks of one side of the locked split (``dev`` or ``test``)."""
    if side not in ("dev", "test"):
        raise ValueError(f"split side {side!r}: dev or test")
    split = load_split()
    ids = split.test if side == "test" else split.dev
    return [t for t in _checkable() if t.id in ids and (sources is None or t.source in sources)]


def per_family(tasks: Sequence[Task], k: int) -> list[Task]:
    """The first ``k`` tasks of each family, by request hash; families interleaved."""
    groups: dict[str, list[Task]] = defaultdict(list)
    for t in sorted(tasks, key=lambda t: body_hash(t.body)):
        groups[family(t)].append(t)
    picked = [sorted(g, key=lambda t: body_hash(t.body))[:k] for _, g in sorted(groups.items())]
    return [t for i in range(k) for g in picked if i < len(g) for t in [g[i]]]


def _python_file(rng: random.Random, lines: int) -> tuple[str, str]:
    names = ["load", "parse", "check", "store", "render", "merge", "split", "count"]
    body, name = [], rng.choice(names) + "_items"
    for i in range(lines // 4):
        fn = f"{rng.choice(names)}_{i}"
        body += [f"def {fn}(items, limit={rng.randint(2, 9)}):",
                 f"    result = {name}(items)[:limit]",
                 f"    return [x * {rng.randint(2, 7)} for x in result]", ""]  # fmt: skip
    return "\n".join(body), name


def repetitive_bodies(n: int, seed: int = 11, max_tokens: int = 384) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            code, name = _python_file(rng, 32)
            text = (f"Rewrite this file, renaming `{name}` to `fetch_items` everywhere. "
                    f"Output only the whole new file.\n\n```python\n{code}\n```")  # fmt: skip
        elif kind == 1:
            items = [{"id": j, "name": f"item-{rng.randint(100, 999)}", "qty": rng.randint(1, 9)}
                     for j in range(16)]  # fmt: skip
            text = ("Copy this JSON list exactly, but set the qty of id 5 to 0. Output only "
                    f"the JSON.\n\n{json.dumps(items, indent=1)}")  # fmt: skip
        else:
            log = [f"[{k:03d}] {'ERROR' if k % 5 == 3 else 'INFO'} step {k}: "
                   f"{'test_' + rng.choice(['parse', 'load', 'save']) + ' failed' if k % 5 == 3 else 'ok'}"
                   for k in range(24)]  # fmt: skip
            text = ("Here is the tool output of the last run:\n\n" + "\n".join(log) +
                    "\n\nQuote every ERROR line exactly, one per line, then say which test "
                    "to fix first.")  # fmt: skip
        out.append({"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens})
    return out
