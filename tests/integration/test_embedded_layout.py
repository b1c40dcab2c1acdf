"""The gateway over the tiers of the embedded ``full-replicas`` layout, its two vLLM servers
stood in for by fakes on the layout's ports: one tier, two replicas, no fast tier.

(The layout on real vLLM servers is not in the suite: starting two takes from 35 s on a quiet
machine to over 3 minutes on a loaded one.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from gateway.cli import embedded
from gateway.config import EmbeddedSettings
from gateway.upstream.family_probe import family_problems
from router.types import Tier
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve_in_thread

HELLO = [{"role": "user", "content": "Say hello."}]


def test_auto_is_served_by_both_full_replicas_and_fast_does_not_exist(
    make_stack, monkeypatch, tmp_path
):
    monkeypatch.setattr(embedded, "provision", lambda *a, **k: Path("/m/full"))
    monkeypatch.setattr(embedded.os, "sched_getaffinity", lambda pid: {0, 1})
    first, second = FakeUpstream("full"), FakeUpstream("full-2")
    with contextlib.ExitStack() as running:
        ports = [urlsplit(running.enter_context(serve_in_thread(f.app))).port for f in (first, second)]  # fmt: skip
        settings = EmbeddedSettings(
            layout="full-replicas", home=tmp_path, full_port=ports[0], fast_port=ports[1]
        )
        tiers = embedded.build_stack(settings).tiers
        assert asyncio.run(family_problems(tiers)) == []  # one tier: nothing to compare
        # a policy that always chooses the fast tier, to see where its choice lands
        stack = make_stack(
            [], tiers={"full": tiers[Tier.FULL].model_dump()}, router={"policy": "always_fast"}
        )
        deadline = time.monotonic() + 10  # ready once one replica of the tier is checked
        while httpx.get(stack.url + "/ready", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the one tier never became ready"
            time.sleep(0.05)
        client = stack.client()
        assert [m.id for m in client.models.list()] == ["auto", embedded.FULL_MODEL_NAME]
        reasons = {}
        for model in ("auto", "full"):
            raw = client.chat.completions.with_raw_response.create(model=model, messages=HELLO)
            assert raw.headers["x-gearshift-tier"] == "full"
            reasons[model] = raw.headers["x-gearshift-route-reason"]
        assert reasons == {"auto": "always_fast: constant policy; only tier", "full": "pinned"}
        with pytest.raises(openai.NotFoundError) as err:
            client.chat.completions.create(model="fast", messages=HELLO)
    assert err.value.code == "model_not_found"
    assert err.value.message.endswith(f"available: auto, full, {embedded.FULL_MODEL_NAME}")
    assert len(first.requests) == len(second.requests) == 1  # one request each, in turns
