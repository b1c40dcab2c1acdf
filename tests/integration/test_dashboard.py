"""The operators' dashboard: its access rules over plain HTTP, and a real browser (Debian's
Chromium, headless, driven by Playwright) logging in and walking from the overview to one
session's episode timeline. Screenshots of each page go to $GEARSHIFT_SCREENSHOTS (default:
the test's temporary directory)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from gateway.auth import hash_key
from tests.support.fake_upstream import Behaviour, FakeUpstream

KEYS = {"admin": "gs-dashboard-admin", "agent": "gs-dashboard-agent"}
AUTH = {
    "mode": "keys",
    "keys": [
        {"name": "ops", "tenant": "ops", "sha256": hash_key(KEYS["admin"]), "admin": True},
        {"name": "coder", "tenant": "acme", "sha256": hash_key(KEYS["agent"])},
    ],
}
CALL = {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"q": "x"}'}}
HOSTILE = '<img src=x onerror="alert(1)">'
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def bearer(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[who]}"}


@pytest.fixture
def stack(make_stack):
    up = FakeUpstream().then(
        Behaviour(message={"role": "assistant", "content": None, "tool_calls": [CALL]})
    )
    stack = make_stack([up], [FakeUpstream()], auth=AUTH)
    client = stack.client(api_key=KEYS["agent"])
    for model in ("full", "fast"):
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "look"}],
            extra_headers={"x-session-id": HOSTILE},
        )
    r = httpx.post(
        stack.url + "/v1/sessions/" + quote(HOSTILE) + "/end",
        json={"outcome": HOSTILE},
        headers=bearer("agent"),
    )
    assert r.status_code == 200, r.text
    return stack


def test_pages_need_an_admin_key(stack):
    d = stack.url + "/dashboard"
    r = httpx.get(d)
    assert (r.status_code, r.headers["location"]) == (303, "/dashboard/login")
    assert httpx.get(d, headers=bearer("agent")).status_code == 403
    assert httpx.get(d, headers={"authorization": "Bearer gs-nope"}).status_code == 401
    assert httpx.get(d, headers=bearer("admin")).status_code == 200
    # a stale cookie (revoked or rotated key) sends the browser back to the login form
    r = httpx.get(d, cookies={"gearshift_dashboard": "gs-revoked"})
    assert r.status_code == 303


def test_login_sets_a_strict_cookie_and_refuses_other_sites(stack):
    login = stack.url + "/dashboard/login"
    r = httpx.post(login, data={"key": KEYS["agent"]})
    assert r.status_code == 403 and "not an admin key" in r.text
    assert httpx.post(login, data={"key": "wrong"}).status_code == 401
    r = httpx.post(login, data={"key": KEYS["admin"]}, headers={"origin": "https://evil.example"})
    assert r.status_code == 403
    assert httpx.post(login, content=b"key=" + b"x" * 5000).status_code == 413
    r = httpx.post(login, data={"key": KEYS["admin"]})
    assert r.status_code == 303
    cookie = r.headers["set-cookie"].lower()
    assert all(f in cookie for f in ("httponly", "samesite=strict", "path=/dashboard"))
    page = httpx.get(stack.url + "/dashboard", cookies=r.cookies)
    assert page.status_code == 200 and "Agent metrics per tenant" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]


def test_what_clients_wrote_is_shown_escaped(stack):
    h = bearer("admin")
    listing = httpx.get(stack.url + "/dashboard/sessions", headers=h).text
    assert HOSTILE not in listing and "&lt;img src=x" in listing
    missing = httpx.get(stack.url + "/dashboard/sessions/nope", headers=h)
    assert missing.status_code == 404
    for query in ("?window=forever", "?tenant=%00", "?before=garbage"):
        assert httpx.get(stack.url + "/dashboard" + query, headers=h).status_code == 200


def screenshots(tmp_path: Path) -> Path:
    shots = Path(os.environ.get("GEARSHIFT_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    return shots


def launch(pw: Any) -> Any:
    return pw.chromium.launch(
        executable_path=CHROMIUM,
        args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    )  # fmt: skip


def logged_in(browser: Any, url: str) -> Any:
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.goto(url + "/dashboard")
    assert page.url.endswith("/dashboard/login")
    page.fill("input[name=key]", KEYS["admin"])
    page.click("button[type=submit]")
    page.wait_for_url("**/dashboard")
    return page


needs_chromium = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed"
)


@needs_chromium
def test_a_browser_walks_from_the_overview_to_an_episode(stack, tmp_path):
    from playwright.sync_api import sync_playwright

    shots = screenshots(tmp_path)
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = logged_in(browser, stack.url)
            assert page.locator("#metrics-tenant tr[data-group=acme]").count() == 1
            assert page.locator("svg.chart").count() == 4
            tiers = {
                page.locator("svg.chart rect.bar").nth(i).get_attribute("data-series")
                for i in range(page.locator("svg.chart rect.bar").count())
            }
            assert {"full", "fast"} <= tiers
            page.screenshot(path=str(shots / "dashboard-overview.png"), full_page=True)

            page.click("text=Sessions")
            page.wait_for_url("**/dashboard/sessions")
            page.screenshot(path=str(shots / "dashboard-sessions.png"), full_page=True)
            page.click(f"#sessions a:text-is('{HOSTILE}')")
            page.wait_for_selector("#timeline")
            assert page.locator("#timeline tr.step").count() == 2
            assert page.locator("#timeline tr.step[data-tier=full] .tool-call").count() == 1
            assert page.locator("h1").inner_text() == f"Session {HOSTILE}"
            page.screenshot(path=str(shots / "dashboard-session.png"), full_page=True)

            page.click("text=Log out")
            page.wait_for_url("**/dashboard/login")
            page.goto(stack.url + "/dashboard")
            assert page.url.endswith("/dashboard/login")
        finally:
            browser.close()


@needs_chromium
def test_an_operator_rolls_back_and_pulls_a_kill_switch_in_the_browser(make_stack, tmp_path):
    from playwright.sync_api import sync_playwright

    stack = make_stack([FakeUpstream()], [FakeUpstream()], auth=AUTH)
    admin = {"authorization": f"Bearer {KEYS['admin']}"}
    ids = [
        httpx.post(
            stack.url + "/admin/v1/routing/versions",
            json={"policy": policy, "note": f"everything {policy}"},
            headers=admin,
        ).json()["id"]
        for policy in ("always_fast", "always_full")
    ]

    def serving() -> dict[str, Any]:
        return httpx.get(stack.url + "/admin/v1/routing", headers=admin).json()["serving"]

    def tier() -> str:
        client = stack.client(api_key=KEYS["agent"])
        r = client.chat.completions.with_raw_response.create(
            model="auto", messages=[{"role": "user", "content": "hi"}]
        )
        return r.headers["x-gearshift-tier"]

    shots = screenshots(tmp_path)
    with sync_playwright() as pw:
        browser = launch(pw)
        try:
            page = logged_in(browser, stack.url)
            page.click("text=Routing")
            page.wait_for_url("**/dashboard/routing")
            for vid in ids:  # publish fast, then full
                page.click(f"#versions tr[data-version='{vid}'] button:text-is('Publish')")
                page.wait_for_selector(".notice")
                assert serving()["published"] == vid
            assert tier() == "full"
            page.click(f"#versions tr[data-version='{ids[0]}'] a:text-is('diff')")
            page.wait_for_selector("#diff")
            assert "always_fast" in page.locator("#diff").inner_text()
            page.screenshot(path=str(shots / "dashboard-routing.png"), full_page=True)
            page.fill("input[name=note]", "full tier costs too much")
            page.click("#rollback")
            page.wait_for_selector(".notice")
            assert serving()["published"] == ids[0] and tier() == "fast"
            assert "full tier costs too much" in page.locator("#events").inner_text()

            page.click("text=Kill switches")
            page.wait_for_url("**/dashboard/switches")
            page.select_option("#new-switch select[name=kind]", "all_to_full")
            page.fill("#new-switch input[name=reason]", "incident 12")
            page.click("#new-switch button")
            page.wait_for_selector("#switches tr[data-switch='all_to_full:']")
            assert tier() == "full"  # the published version says fast; the switch wins
            page.screenshot(path=str(shots / "dashboard-switches.png"), full_page=True)
            page.click("#switches tr[data-switch='all_to_full:'] button")
            page.wait_for_selector(".notice")
            assert tier() == "fast"
            switches = httpx.get(stack.url + "/admin/v1/kill-switches", headers=admin).json()
            assert [(e["active"], e["actor"], e["reason"]) for e in switches["events"]] == [
                (False, "ops", None), (True, "ops", "incident 12"),
            ]  # fmt: skip
        finally:
            browser.close()


def test_control_forms_refuse_other_sites_and_bad_values(stack):
    h = bearer("admin")
    r = httpx.post(
        stack.url + "/dashboard/switches",
        data={"kind": "all_to_full", "active": "true"},
        headers={**h, "origin": "https://evil.example"},
    )
    assert r.status_code == 403
    for form in (
        {"kind": "tier_off", "target": "gpu", "active": "true"},
        {"kind": "bogus", "active": "true"},
        {"kind": "sandbox_off", "target": "x", "active": "true"},
    ):
        r = httpx.post(stack.url + "/dashboard/switches", data=form, headers=h)
        assert r.status_code == 400, form
    r = httpx.post(stack.url + "/dashboard/routing/canary", data={"weight": "lots"}, headers=h)
    assert r.status_code == 400 and "number" in r.text
    r = httpx.post(stack.url + "/dashboard/routing/rollback", data={}, headers=h)
    assert r.status_code == 400 and "nothing is published" in r.text


def tool_call(name: str, arguments: str, call_id: str) -> Behaviour:
    made = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return Behaviour(message={"role": "assistant", "content": None, "tool_calls": [made]})


@pytest.fixture
def held_sandbox(sandbox_root) -> Iterator[dict[str, Any]]:
    """The real sandbox service, holding tenant acme's mutating tools for an approval; the
    gateway's ``sandbox`` section that reaches it."""
    from sandbox.config import GrantConfig, SandboxConfig
    from sandbox.service import create_app
    from tests.support.servers import free_port, serve_in_thread

    held = GrantConfig(tools=["write_file"], write=["*"], approval=["mutating"])
    port = free_port()
    cfg = SandboxConfig(token="t", root=sandbox_root, host="127.0.0.1", port=port,
                        grants_by_tenant={"acme": held})  # fmt: skip
    with serve_in_thread(create_app(cfg), port=port):
        yield {"token": "t", "host": "127.0.0.1", "port": port}


@needs_chromium
def test_an_operator_answers_the_approval_queue_in_the_browser(make_stack, tmp_path, held_sandbox):
    from playwright.sync_api import sync_playwright

    from tests.support.mcp_server import demo_server
    from tests.support.servers import serve_in_thread

    def shout(text: str, call_id: str) -> Behaviour:
        return tool_call("shout", f'{{"text": "{text}"}}', call_id)

    with serve_in_thread(demo_server()) as mcp:
        url = mcp + "/mcp"
        write = tool_call("write_file", '{"path": "a.txt", "content": "x"}', "c3")
        up = FakeUpstream().then(shout("yes", "c1"), shout("no", "c2"), write, Behaviour(),
                                 Behaviour())  # fmt: skip
        servers = [{"label": "demo", "url": url, "tenants": ["acme"]}]
        stack = make_stack(
            [up], responses={"mcp": {"servers": servers}}, auth=AUTH, sandbox=held_sandbox
        )
        agent = stack.client(api_key=KEYS["agent"])
        tools = [{"type": "mcp", "server_label": "demo", "server_url": url}]
        asked = [agent.responses.create(model="full", input=t, tools=tools) for t in ("a", "b")]
        ids = [r.output[-1].id for r in asked]
        assert all(r.output[-1].type == "mcp_approval_request" for r in asked)
        sandboxed = agent.responses.create(
            model="full", input="c", tools=[{"type": "sandbox", "name": "write_file"}]
        ).output[-1]
        assert (sandboxed.type, sandboxed.server_label) == ("mcp_approval_request", "sandbox")

        shots = screenshots(tmp_path)
        with sync_playwright() as pw:
            browser = launch(pw)
            try:
                page = logged_in(browser, stack.url)
                page.click("text=Approvals")
                page.wait_for_url("**/dashboard/approvals")
                assert page.locator("#approvals tr[data-approval]").count() == 3
                page.screenshot(path=str(shots / "dashboard-approvals.png"), full_page=True)
                # each row says which kind of tool waits
                kinds = page.locator("#approvals tr[data-approval] td.kind").all_inner_texts()
                assert sorted(kinds) == ["MCP server demo", "MCP server demo", "sandbox tool"]
                mine = f"#approvals tr[data-approval='{sandboxed.id}']"
                assert page.get_attribute(mine, "data-kind") == "sandbox"
                page.click(f"{mine} button:text-is('Deny')")
                page.wait_for_selector(".notice")
                assert page.locator("#approvals tr[data-approval]").count() == 2
                row = f"#approvals tr[data-approval='{ids[0]}']"
                page.fill(f"{row} input[name=reason]", "looks safe")
                page.click(f"{row} button:text-is('Approve')")
                page.wait_for_selector(".notice")
                page.click(f"#approvals tr[data-approval='{ids[1]}'] button:text-is('Deny')")
                page.wait_for_selector(".notice")
                assert page.locator("#approvals tr[data-approval]").count() == 0
            finally:
                browser.close()

        done = [
            agent.responses.create(
                model="full", input="go on", previous_response_id=r.id, tools=tools
            ).output[0]
            for r in asked
        ]
        assert (done[0].type, done[0].output, done[0].approval_request_id) == (
            "mcp_call", "YES", ids[0],
        )  # fmt: skip
        assert done[1].type == "mcp_call" and done[1].status == "failed"
        assert done[1].output == "error: denied: the call was not approved (by operator:ops)"


def test_without_a_store_the_pages_say_so(make_stack):
    stack = make_stack([FakeUpstream()], store={"enabled": False})
    for page in ("/dashboard", "/dashboard/sessions", "/dashboard/approvals"):
        r = httpx.get(stack.url + page)
        assert r.status_code == 503 and "trajectory store" in r.text, page
    r = httpx.get(stack.url + "/admin/v1/agent-metrics")
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
