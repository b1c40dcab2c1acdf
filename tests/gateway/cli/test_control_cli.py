"""``gearshift routing`` and ``gearshift switch`` on a real store (SQLite and PostgreSQL), as
an operator types them; what they write is what a gateway's control plane reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main


def run(capsys: pytest.CaptureFixture[str], store: str, *argv: str) -> Any:
    assert main([*argv, "--store", store, "--as", "alice"]) == 0
    return json.loads(capsys.readouterr().out)


def test_versions_publish_canary_rollback(store_url, tmp_path: Path, capsys):
    fast, full = tmp_path / "fast.yaml", tmp_path / "full.yaml"
    fast.write_text("policy: always_fast\n")
    full.write_text("policy: length_threshold\nparams: {threshold_tokens: 500}\n")
    a = run(capsys, store_url, "routing", "create", str(fast), "--note", "cheap")["id"]
    b = run(capsys, store_url, "routing", "create", str(full))["id"]
    assert run(capsys, store_url, "routing", "create", str(fast))["created"] is False
    run(capsys, store_url, "routing", "publish", a)
    state = run(capsys, store_url, "routing", "canary", b, "0.2", "--note", "try it")
    assert (state["published"], state["canary"], state["canary_weight"]) == (a, b, 0.2)
    assert run(capsys, store_url, "routing", "canary-off")["canary"] is None
    run(capsys, store_url, "routing", "publish", b)
    assert run(capsys, store_url, "routing", "rollback", "--note", "worse")["published"] == a
    history = run(capsys, store_url, "routing", "history")
    assert [e["action"] for e in history] == ["rollback", "publish", "canary_off", "canary",
                                              "publish"]  # fmt: skip
    assert {e["actor"] for e in history} == {"alice"}
    changes = run(capsys, store_url, "routing", "diff", a, b)
    assert {c["path"] for c in changes} == {"policy", "params.threshold_tokens"}


def test_bad_input_exits_with_a_message(store_url, tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    for text, says in (("policy: nope\n", "unknown routing policy"), ("- x\n", "mapping")):
        bad.write_text(text)
        with pytest.raises(SystemExit, match=says):
            main(["routing", "create", str(bad), "--store", store_url])
    with pytest.raises(SystemExit, match="nothing is published"):
        main(["routing", "rollback", "--store", store_url])
    with pytest.raises(SystemExit, match="no routing version"):
        main(["routing", "publish", "0123456789abcdef", "--store", store_url])
    with pytest.raises(SystemExit, match="needs a target"):
        main(["switch", "on", "tenant_off", "--store", store_url])


def test_switches(store_url, capsys):
    on = run(capsys, store_url, "switch", "on", "tenant_off", "acme", "--reason", "abuse")
    assert (on["active"], on["changed_by"], on["reason"]) == (True, "alice", "abuse")
    run(capsys, store_url, "switch", "off", "tenant_off", "acme")
    listed = run(capsys, store_url, "switch", "list")
    assert [s["active"] for s in listed["switches"]] == [False]
    assert [e["active"] for e in listed["events"]] == [False, True]
