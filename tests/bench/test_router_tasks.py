"""The router evaluation tasks: built from the installed packages, deterministic, and their
checkers score right answers 1 and wrong ones 0 (HumanEval runs in the real sandbox)."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from bench.router_tasks import (
    Task,
    _humaneval_rows,
    all_tasks,
    bfcl_tasks,
    humaneval_tasks,
    mtbench_tasks,
    reasoning_gym_tasks,
)


def call(name: str, args: dict) -> dict:
    return {"tool_calls": [{"function": {"name": name, "arguments": json.dumps(args)}}]}


def test_tasks_are_deterministic_and_unique():
    first, second = all_tasks(0.05), all_tasks(0.05)
    assert [t.key for t in first] == [t.key for t in second]
    assert len({t.id for t in first}) == len(first)
    sources = {t.source for t in first}
    assert sources == {"bfcl", "humaneval", "reasoning_gym", "trivia", "mtbench"}
    assert all(t.check is None for t in first if t.source == "mtbench")
    assert len(list(mtbench_tasks())) == 80


def test_bfcl_checker_scores_arguments():
    task = next(t for t in bfcl_tasks(0.01) if t.id == "bfcl/simple_python_0")
    tool = task.body["tools"][0]["function"]
    assert tool["strict"] is True and tool["parameters"]["type"] == "object"
    assert task.check(call("calculate_triangle_area", {"base": 10, "height": 5})) == 1.0
    # base right, height wrong, the optional unit rightly left out: 2 of 3
    assert task.check(call("calculate_triangle_area", {"base": 10, "height": 6})) == 2 / 3
    assert task.check(call("calculate_triangle_area", {"base": 10, "bogus": 1})) == 0.0
    assert task.check(call("other", {"base": 10, "height": 5})) == 0.0
    assert task.check({"content": "The area is 25."}) == 0.0
    irrelevant = next(t for t in bfcl_tasks(0.05) if t.category == "irrelevance")
    assert irrelevant.body["tool_choice"] == "auto"
    assert irrelevant.check({"content": "I cannot help with that."}) == 1.0
    assert irrelevant.check(call("anything", {})) == 0.0


def test_reasoning_gym_checker_uses_the_package_scorer():
    task = next(iter(reasoning_gym_tasks(1)))
    question = task.body["messages"][0]["content"]
    assert task.id == "rg/chain_sum/0/0" and "Answer with only the final answer" in question
    expression = question.split("problem: ")[1].split(" =")[0]
    right = str(eval(expression, {"__builtins__": {}}))  # our own generated "a + b"
    assert task.check({"content": right}) == 1.0
    assert task.check({"content": f"The answer is {right}."}) == 1.0  # last number
    assert task.check({"content": "no idea"}) < 0.5


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_humaneval_checker_runs_the_tests_in_the_sandbox():
    row = _humaneval_rows()[0]
    task = next(iter(humaneval_tasks(1)))
    good = f"```python\n{row['prompt']}{row['canonical_solution']}```"
    wrong = f"```python\n{row['prompt']}    return False\n```"
    escape = "```python\nimport socket\nsocket.create_connection(('1.1.1.1', 53), 2)\n```"
    assert asyncio.run(task.check({"content": good})) == 1.0
    assert asyncio.run(task.check({"content": wrong})) == 0.0
    assert asyncio.run(task.check({"content": escape})) == 0.0  # no network in the sandbox


def test_eval_examples_need_every_outcome_and_name_the_command():
    from bench.router_eval import SAMPLED_COMMAND, examples_from

    def task(i: int) -> Task:
        return Task(f"t/{i}", "trivia", "qa", None, {"messages": [{"role": "user", "content": str(i)}]}, check=lambda m: 1.0)  # fmt: skip

    tasks = [task(0), task(1), Task("m", "mtbench", "writing", None, {}, check=None)]
    outcomes = {
        tasks[0].key: {"full": {"score": 1.0}, "fast": {"score": 0.0}},
        tasks[1].key: {"full": {"score": 0.5}, "fast": {"score": 0.5}},
    }
    examples = examples_from(tasks, outcomes)
    assert [(e.id, e.full, e.fast, e.label()) for e in examples] == [
        ("t/0", 1.0, 0.0, 1), ("t/1", 0.5, 0.5, 0)]  # fmt: skip
    del outcomes[tasks[1].key]
    with pytest.raises(
        SystemExit, match=r"1 tasks have no cached outcome \(first: t/1\).*--samples 4"
    ):
        examples_from(tasks, outcomes, SAMPLED_COMMAND)
