"""bench.context's ``--window`` and the split of its figures by whether a session fits:
the mock says the window and answers vLLM's context-length 400 above it, a session where
``none`` got that 400 counts as not fitting (``default`` still answers it), the headline is
on the sessions that fit (issue #24's definition) and ``accuracy_not_fitting`` on the
others; the reader is served with the window asked for."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from bench import context, reader_model
from bench.context import figures, headline, upstreams
from bench.context_measure import Score, Tally
from bench.context_upstream import ContextUpstream, too_long
from tests.bench.test_quick import ROOT


def chat(chars: int) -> bytes:
    return orjson.dumps({"model": "mock-full", "max_tokens": 12,
                         "messages": [{"role": "user", "content": "x" * chars}]})  # fmt: skip


def test_too_long_is_vllms_context_length_400_above_the_window_only() -> None:
    body = chat(4000)  # ~1,000 tokens: one per 4 bytes of the body
    n = len(body) // 4
    assert too_long(body, n) is None  # the prompt alone counts, as vLLM 0.32's check
    error = orjson.loads(too_long(body, n - 1) or b"{}")["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == "input_tokens"
    assert error["message"].startswith(f"This model's maximum context length is {n - 1} tokens.")
    assert f"your prompt contains {n} input tokens" in error["message"]
    assert context.CONTEXT_LENGTH in error["message"]


async def test_the_mock_says_its_window_and_refuses_a_longer_prompt() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ContextUpstream(600), "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(base + "/v1/models") as resp:
                assert (await resp.json())["data"][0]["max_model_len"] == 600
            async with http.post(base + "/tokenize", data=chat(10)) as resp:
                assert (await resp.json())["max_model_len"] == 600
            async with http.post(base + "/v1/chat/completions", data=chat(100)) as resp:
                assert resp.status == 200
                assert (await resp.json())["choices"][0]["message"]["content"] == "ok"
            async with http.post(base + "/v1/chat/completions", data=chat(4000)) as resp:
                assert resp.status == 400
                assert "maximum context length is 600" in (await resp.json())["error"]["message"]
    finally:
        server.close()


def session(right: list[bool], tokens: int, context_errors: int = 0) -> Tally:
    # a request refused for its length is an error, its prompt uncounted
    t = Tally(prompt_tokens=[tokens] if tokens else [], ms=[1.0], sessions=1,
              errors=context_errors, context_errors=context_errors)  # fmt: skip
    t.answered("build", [Score(exact=r, normalised=r) for r in right], [])
    return t


def test_figures_split_the_sessions_by_whether_none_fit() -> None:
    # sessions 0 and 1 fit; session 2 does not: none's 400s, default answers from its room
    per = {
        "none": [session([True, True], 100), session([True, False], 100),
                 session([False, False], 0, context_errors=4)],
        "default": [session([True, False], 40), session([True, False], 40),
                    session([True, True], 40)],
    }  # fmt: skip
    fit = [t.context_errors == 0 for t in per["none"]]
    out = figures(per, fit, ["none", "default"])
    assert out["sessions_fitting"] == 2 and out["sessions_not_fitting"] == 1
    fitting, others = out["fitting"], out["not_fitting"]
    assert fitting["none"]["accuracy"] == 0.75 and fitting["default"]["accuracy"] == 0.5
    assert out["accuracy_vs_none"] == fitting["default"]["accuracy_vs_none"] == 0.667
    assert out["prompt_tokens_saved"] == 0.6  # 40 of 100 tokens per step, fitting only
    assert out["accuracy_not_fitting"] == {"none": 0.0, "default": 1.0}
    assert others["none"]["errors"] == 4 and others["default"]["errors"] == 0
    lo, hi = out["accuracy_vs_none_ci95"]
    assert lo <= 0.667 <= hi
    assert "fit" in out["headline_on"]
    # every session: the rows as before the split
    assert out["strategies"]["none"]["accuracy"] == 0.5
    assert out["strategies"]["default"]["accuracy"] == round((0.5 + 0.5 + 1) / 3, 3)


def test_figures_where_every_session_fits_are_the_whole_runs() -> None:
    per = {"none": [session([True], 100), session([True], 100)],
           "default": [session([True], 50), session([False], 50)]}  # fmt: skip
    out = figures(per, [True, True], ["none", "default"])
    assert out["fitting"] == out["strategies"] and out["not_fitting"] is None
    assert out["sessions_not_fitting"] == 0 and out["accuracy_not_fitting"] is None
    whole = headline(out["strategies"], ["none", "default"])
    assert {k: out[k] for k in whole} == whole
    assert out["accuracy_vs_none"] == 0.5 and out["prompt_tokens_saved"] == 0.5


def test_figures_with_no_session_that_fits_have_no_ratio() -> None:
    per = {"none": [session([False], 0, context_errors=2)], "default": [session([True], 30)]}
    out = figures(per, [False], ["none", "default"])
    assert out["fitting"] is None and out["sessions_fitting"] == 0
    assert out["accuracy_vs_none"] is None and out["accuracy_vs_none_ci95"] is None
    assert out["prompt_tokens_saved"] is None
    assert out["accuracy_not_fitting"] == {"none": 0.0, "default": 1.0}


def test_a_stored_session_over_the_window_does_not_fit_and_default_answers_it() -> None:
    """The dev split's first four sessions at a 5,400-token window (the mock's tokens):
    sessions 0 and 1 are longer (~5,620 and ~5,480), 2 and 3 shorter (~5,280, ~4,770)."""
    argv = [sys.executable, "-m", "bench.context", "--sessions", "4", "--replay", "1",
            "--window", "5400", "--strategies", "none,default"]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["window"] == 5400 and last["budget"] == 2700  # the budget: half of it
    assert last["sessions_fitting"] == 2 and last["sessions_not_fitting"] == 2
    others = last["not_fitting"]
    assert others["none"]["errors"] == 2 * 5  # a step, 3 early questions, the end task
    assert others["none"]["accuracy"] == 0.0 and others["none"]["end_task"] == 0.0
    assert others["default"]["errors"] == 0 and others["default"]["accuracy"] > 0
    assert last["accuracy_not_fitting"]["none"] == 0.0
    assert last["fitting"]["none"]["accuracy"] == 1.0 and last["fitting"]["none"]["errors"] == 0
    assert last["accuracy_vs_none"] == last["fitting"]["default"]["accuracy_vs_none"]
    assert "sessions that do not fit (none: a context-length 400): 2" in proc.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--window", "100"], "256 or more"), (["--upstream", "real", "--window", "8192"], "4096")],
)
def test_a_window_the_bench_cannot_serve_is_refused(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setattr(sys, "argv", ["bench.context", *argv])
    with pytest.raises(SystemExit):
        context.parse_args()
    assert message in capsys.readouterr().err


def test_the_reader_is_served_with_the_window_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[reader_model.Reader] = []

    @contextlib.contextmanager
    def serving(tmp: Path, reader: reader_model.Reader) -> Iterator[str]:
        served.append(reader)
        yield "http://reader"

    (tmp_path / "config.json").write_text("{}")  # a provisioned folder
    monkeypatch.setattr(reader_model.Reader, "folder", lambda self, home=None: tmp_path)
    monkeypatch.setattr(reader_model, "serving", serving)
    with upstreams("reader", tmp_path, "0.5b", 8192) as (_, _, names, window):
        assert window == 8192 and names == reader_model.READERS["0.5b"].served_names
    with upstreams("reader", tmp_path, "0.5b") as (_, _, _, window):
        assert window == reader_model.READERS["0.5b"].window == 16384  # its own: unchanged
    assert [r.window for r in served] == [8192, 16384]
    assert served[0].sha256 == reader_model.READERS["0.5b"].sha256
