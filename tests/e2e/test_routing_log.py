"""Routed steps of the real stack, graded by the client, read back as the log the router
learns from (`gearshift router train --from-store`; the learning is tested in
tests/router/test_offpolicy.py and tests/integration/test_router_from_store.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from gateway.export.load import Filter
from gateway.export.routing import Counts, logged_steps
from gateway.store.database import make_engine
from router.types import Tier

pytestmark = pytest.mark.e2e

PROMPTS = [("What is 12 * 7? Answer with the number.", "84"), ("Say hello.", "hello")]


def test_graded_routed_steps_come_back_with_tier_propensity_and_reward(real_stack):
    since = datetime.now(UTC)
    client = real_stack.client()
    seen = {}
    for i, (prompt, expected) in enumerate(PROMPTS):
        raw = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=12,
            temperature=0, extra_headers={"x-session-id": f"routing-log-{i}"},
        )  # fmt: skip
        answer = raw.parse().choices[0].message.content or ""
        score = 1.0 if expected in answer.lower() else 0.0  # the client's own grader
        step = raw.headers["x-gearshift-step-id"]
        fb = httpx.post(f"{real_stack.url}/v1/feedback", json={"step_id": step, "score": score})
        assert fb.status_code == 201, fb.text
        seen[step.split(",")[0]] = (Tier(raw.headers["x-gearshift-tier"]), score)

    engine = make_engine(real_stack.store_url)
    counts = Counts()
    with engine.connect() as conn:
        logged = list(
            logged_steps(conn, Filter(since=since), {"user_feedback": 1.0}, counts=counts)
        )
    engine.dispose()
    mine = {s.id: s for s in logged if s.id in seen}
    assert len(mine) == len(PROMPTS)
    for ident, (tier, score) in seen.items():
        s = mine[ident]
        # the default chain does not explore: each choice had probability 1
        assert (s.tier, s.reward, s.propensity) == (tier, score, 1.0)
        assert s.body["messages"][0]["content"] in {p for p, _ in PROMPTS}
