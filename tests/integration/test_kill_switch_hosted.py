"""Kill switches in the hosted tool loop: checked at every iteration, a switched-off tool
reaches the model as a denial and never runs (the real sandbox behind it)."""

from __future__ import annotations

import httpx

from tests.integration.test_responses_hosted import CODE, PYTHON, asks, hosted_stack
from tests.support.fake_upstream import Behaviour, FakeUpstream

__all__ = ["hosted_stack"]  # the fixture, shared with the hosted loop's own tests


def test_a_switched_off_sandbox_is_a_denial_for_the_model(hosted_stack):
    up = FakeUpstream().then(asks(PYTHON), Behaviour(), asks(PYTHON), Behaviour())
    stack = hosted_stack(up)
    client = stack.client()

    def switch(active: bool) -> None:
        body = {"kind": "sandbox_off", "active": active, "reason": "incident 3"}
        r = httpx.post(stack.url + "/admin/v1/kill-switches", json=body)
        assert r.status_code == 200, r.text

    def ask() -> object:
        return client.responses.create(
            model="full", input="compute", tools=[CODE], tool_choice={"type": "code_interpreter"}
        )

    switch(True)
    r = ask()
    call = r.output[0]
    assert call.type == "code_interpreter_call" and call.status == "failed"
    told = up.requests[1]["messages"][-1]
    assert told["role"] == "tool" and "kill switch sandbox_off" in told["content"]
    switch(False)
    r = ask()
    assert r.output[0].outputs[0].logs == "42\n"  # runs again at once


def test_a_key_scoped_to_other_tools_gets_a_denial_in_the_loop(hosted_stack):
    from gateway.auth import hash_key

    auth = {
        "mode": "keys",
        "keys": [{"name": "reader", "tenant": "default", "sha256": hash_key("gs-reader"),
                  "tools": ["read_file"]}],
    }  # fmt: skip
    up = FakeUpstream().then(asks(PYTHON), Behaviour())
    stack = hosted_stack(up, auth=auth)
    r = stack.client(api_key="gs-reader").responses.create(
        model="full", input="compute", tools=[CODE], tool_choice={"type": "code_interpreter"}
    )
    assert r.output[0].status == "failed"
    told = up.requests[1]["messages"][-1]["content"]
    assert told == "error: denied: this API key may not run the tool 'run_python'"
