"""`gearshift router train --from-store`: a policy that explores logs its choices through the
gateway into the store, a client grades the answers with feedback, and the command learns
from that log which requests need the full tier."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from router.classifier import Classifier
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.tools import WEATHER_TOOLS

EXPLORING = {"policy": "classifier", "params": {"explore": 0.3, "sampled_model": None}}
STEADY = {"interval_s": 60.0, "timeout_s": 10.0, "unhealthy_after": 5}
GEARSHIFT = str(Path(sys.executable).with_name("gearshift"))


def ask(stack, content: str, session: str, model: str = "auto", **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    r = httpx.post(stack.url + "/v1/chat/completions", json=body, headers={"x-session-id": session})
    assert r.status_code == 200, r.text
    return r


def traffic(stack, numbers: range) -> dict[str, int]:
    """Routed requests, graded by the client: proofs need the full tier, greetings do not."""
    tiers = {"full": 0, "fast": 0}
    for i in numbers:
        hard = i % 2 == 0
        text = f"prove that lemma {i} holds for every graph" if hard else f"say hi to guest {i}"
        r = ask(stack, text, f"s{i}")
        tier = r.headers["x-gearshift-tier"]
        tiers[tier] += 1
        grade(stack, r, 1.0 if tier == "full" or not hard else 0.0)
    return tiers


def grade(stack, r: httpx.Response, score: float) -> None:
    step = r.headers["x-gearshift-step-id"]
    fb = httpx.post(stack.url + "/v1/feedback", json={"step_id": step, "score": score})
    assert fb.status_code == 201, fb.text


def train(store_url: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GEARSHIFT, "router", "train", "--from-store", "--store", store_url, "--out", str(out),
         "--weights", "user_feedback=1,truncated=0,failed=0,tool_call_valid=0", *extra],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_learns_from_explored_steps_and_their_feedback(make_stack, tmp_path: Path):
    bad_call = {"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"town": 3}'}}  # fmt: skip
    fast = FakeUpstream("fast").then(
        Behaviour(message={"role": "assistant", "content": None, "tool_calls": [bad_call]})
    )
    # no health-check ejections on a busy machine: a fallback step would leave the log
    stack = make_stack([FakeUpstream("full")], [fast], router=EXPLORING, health=STEADY)
    escalated = ask(stack, "weather in Paris?", "tools", tools=WEATHER_TOOLS)
    assert "escalated to full" in escalated.headers["x-gearshift-route-reason"]
    grade(stack, ask(stack, "anything", "pinned", model="full"), 1.0)  # no routing decision
    tiers = traffic(stack, range(60))
    assert min(tiers.values()) >= 10  # explore sent some of each kind both ways
    time.sleep(0.01)
    later = datetime.now(UTC).isoformat()
    traffic(stack, range(100, 140))  # held out: for the evaluation below

    out = tmp_path / "router.json"
    done = train(stack.store_url, out, "--until", later)
    assert done.returncode == 0, done.stderr
    assert "62 steps in 62 sessions: 61 routed (1 escalated" in done.stdout
    assert "1 pinned or unrouted" in done.stdout and "warning" not in done.stdout
    spec = json.loads(out.read_text())
    t = spec["training"]
    assert (t["steps"], t["explored_steps"], t["source"]) == (61, 61, "logged steps")
    assert t["ips"]["always_full"] > t["ips"]["always_fast"]
    model = Classifier.load(out)

    def p(text: str) -> float:
        return model.predict({"messages": [{"role": "user", "content": text}]}).probability

    assert (
        p("prove that lemma 99 holds for every graph") > model.threshold > p("say hi to guest 99")
    )

    # the new model on the later steps, estimated from what the exploring policy logged
    ev = subprocess.run(
        [GEARSHIFT, "router", "eval", "--from-store", "--store", stack.store_url, "--since", later,
         "--model", str(out), "--weights", "user_feedback=1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    report = json.loads(ev.stdout.splitlines()[-1])
    assert report["steps"] == 40 and "40 steps in 40 sessions" in ev.stdout
    # every proof on full, every greeting on fast: the best reward at the lowest full share
    assert report["model"] == pytest.approx(1.0) and report["full_share"] == pytest.approx(0.5)
    assert report["model"] > report["logged"] and report["always_fast"] < 0.75
    # the reward-for-full-share table: nothing on full earns always-fast's, all on full its own
    table = report["tradeoff"]
    # (the same estimate summed in another order: equal up to rounding)
    assert table[0]["reward"] == pytest.approx(report["always_fast"])
    assert table[-1]["reward"] == pytest.approx(report["always_full"])
    assert "share of steps on full -> estimated mean reward" in ev.stdout


def test_refuses_a_log_without_both_tiers_and_says_why(make_stack, tmp_path: Path):
    stack = make_stack(
        [FakeUpstream("full")], [FakeUpstream("fast")], router={"policy": "always_fast"},
        health=STEADY,
    )  # fmt: skip
    for i in range(3):
        grade(stack, ask(stack, f"hello {i}", f"s{i}"), 1.0)
    done = train(stack.store_url, tmp_path / "router.json")
    assert done.returncode == 1
    assert "warning: no step was explored" in done.stdout
    assert "needs steps of both tiers" in done.stderr and "explore" in done.stderr
    assert not (tmp_path / "router.json").exists()
    no_out = subprocess.run(
        [GEARSHIFT, "router", "train", "--from-store", "--store", stack.store_url],
        capture_output=True, text=True,
    )  # fmt: skip
    assert no_out.returncode == 1 and "name the model file to write with --out" in no_out.stderr
    for command in ("train", "eval"):
        neither = subprocess.run([GEARSHIFT, "router", command], capture_output=True, text=True)
        assert neither.returncode == 1 and "examples file or --from-store" in neither.stderr
