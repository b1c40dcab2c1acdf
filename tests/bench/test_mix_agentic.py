"""The routed mix on agent sessions without a model: a session's steps go in order, one per
round, and each arm is scored by agreement with always-full's answers."""

from __future__ import annotations

import argparse

import pytest

from bench import mix_agentic
from bench.mix_arms import ARMS, Outcome
from bench.routed_mix import main
from bench.tier_agentic import Step, load


def test_rounds_keep_each_sessions_steps_in_order():
    steps = load(sessions=3)
    rounds = mix_agentic.rounds(steps)
    assert sum(len(r) for r in rounds) == len(steps)
    for r in rounds:  # no session has two steps in flight
        assert len({s.session for s in r}) == len(r)
    for session in {s.session for s in steps}:
        order = [s.step for r in rounds for s in r if s.session == session]
        assert order == sorted(order) == list(range(len(order)))


def _message(step: Step, same: bool) -> dict:
    if step.forced is None:
        return {"content": "done" if same else "something else"}
    args = '{"path": "a.txt"}' if same else '{"path": "b.txt"}'
    return {"tool_calls": [{"function": {"name": step.forced, "arguments": args}}]}


def test_summary_scores_agreement_with_full_and_the_routed_share():
    steps = load(sessions=3)
    tally = {}
    for arm in ARMS:
        outs = []
        for k, s in enumerate(steps):
            # routed: forced steps on full (agreeing), free steps on fast (differing);
            # always-fast: every other step differs
            tier = {"full": "full", "fast": "fast"}.get(arm) or ("full" if s.forced else "fast")
            same = tier == "full" or (arm == "fast" and k % 2 == 0)
            outs.append(Outcome(mix_agentic.step_id(s), 1.0, 200, _message(s, same), tier, ""))
        cpu = {"routed": 8.0, "full": 10.0, "fast": 5.0}[arm]
        tally[arm] = {"out": outs, "cpu_s": cpu, "wall_s": 4.0}
    args = argparse.Namespace(boot=100, concurrency=4, threshold=None)
    got = mix_agentic.summarize(steps, tally, args)
    forced = sum(1 for s in steps if s.forced)
    assert (got["tasks"], got["forced_steps"], got["sessions"]) == (len(steps), forced, 3)
    assert got["quality_vs_full"] == 1.0  # every forced call agrees
    assert got["fast_share"] == round((len(steps) - forced) / len(steps), 3)
    assert got["tasks_per_cpu_s_ratio"] == 1.25 and got["baseline_fast"]["tasks_per_cpu_s_ratio"] == 2.0  # fmt: skip
    assert got["arms"]["full"]["quality"] == 1.0
    assert got["arms"]["routed"]["quality"] == round(forced / len(steps), 4)
    assert 0 < got["baseline_fast"]["quality_vs_full"] < 1


def test_a_negative_session_count_is_refused():
    with pytest.raises(SystemExit, match="agentic-sessions"):
        main(["--agentic-sessions", "-1"])


def test_each_arm_keeps_its_own_prefix_cache():
    (step, *_) = load(sessions=1)
    assert mix_agentic.as_task(step).body == step.request
    salted = mix_agentic.as_task(step, "run-routed").body
    assert (
        salted == {**step.request, "cache_salt": "run-routed"} and "cache_salt" not in step.request
    )
