"""``bench.stage_cpu``'s stages (innermost matching frame wins, the loop inside a stage is
the stage's) and ``bench.stage_sampler``'s dump (CPU by stack, reset at each dump). The
whole run is covered by tests/bench/test_quick.py."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bench import stage_cpu, stage_sampler
from bench.stage_cpu import LOOP, ORDER, REST, ROUTE, SERVER, read_dump, shares, stage_of

OUTER = ";".join([
    "<module> (bench/stage_sampler.py)",
    "main (gateway/cli/main.py)",
    "run (uvloop/__init__.py)",
    "Runner.run (/usr/lib/python3.11/asyncio/runners.py)",
])  # fmt: skip
REQUEST = OUTER + ";RequestResponseCycle.run_asgi (uvicorn/protocols/http/httptools_impl.py)"


def test_the_innermost_matching_frame_wins() -> None:
    route = REQUEST + ";CompletionPipeline.__call__ (gateway/pipeline/handler.py)"
    route += ";RouteStage.__call__ (gateway/pipeline/route.py);features (gateway/routing/x.py)"
    assert stage_of(route) == ROUTE
    assert stage_of(REQUEST) == SERVER
    aiohttp = route + ";ClientSession._request (aiohttp/client.py)"
    assert stage_of(aiohttp) == "aiohttp + yarl + multidict"


def test_the_loop_counts_only_outside_every_stage() -> None:
    assert stage_of(OUTER) == LOOP  # the loop's own time, between callbacks
    inside = REQUEST + ";RouteStage.__call__ (gateway/pipeline/route.py)"
    assert stage_of(inside + ";Future.result (asyncio/futures.py)") == ROUTE


def test_what_matches_no_stage_is_the_rest() -> None:
    assert stage_of("<module> (x.py);busy (elsewhere/y.py)") == REST
    inside = REQUEST + ";CompletionPipeline._dispatch (gateway/pipeline/handler.py)"
    assert stage_of(inside) == "dispatch, the gateway's own"
    assert stage_of(inside + ";answer (gateway/pipeline/handler.py)") == REST


def test_a_dump_read_back_by_stage() -> None:
    head = {"seq": 2, "samples": 3, "main_cpu_s": 0.4, "other_cpu_s": 0.0}
    text = "\n".join([json.dumps(head), f"{OUTER} 100",
                      f"{REQUEST};RouteStage.__call__ (gateway/pipeline/route.py) 300", ""])  # fmt: skip
    got_head, by_stage = read_dump(text)
    assert got_head == head
    assert by_stage == Counter({LOOP: 100, ROUTE: 300})
    got = shares(by_stage)
    assert list(got) == ORDER and got[ROUTE] == 75.0 and got[LOOP] == 25.0 and got[REST] == 0.0


def _spin(seconds: float) -> None:
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass


def test_the_sampler_counts_cpu_by_stack_and_resets(tmp_path: Path) -> None:
    out = tmp_path / "stacks.txt"
    sampler = stage_sampler.Sampler(out)
    sampler.install()
    try:
        _spin(0.3)
        sampler.dump()
        first = out.read_text().splitlines()
        _spin(0.05)
        sampler.dump()
    finally:
        sampler.uninstall()
    head = json.loads(first[0])
    assert head["seq"] == 1 and head["samples"] > 0
    counted = {line.rsplit(" ", 1)[0]: int(line.rsplit(" ", 1)[1]) for line in first[1:]}
    spun = sum(us for stack, us in counted.items() if stack.endswith(
        "_spin (tests/bench/test_stage_cpu.py)"))  # fmt: skip
    assert spun > 0 and spun <= head["main_cpu_s"] * 1e6 + 1
    again = json.loads(out.read_text().splitlines()[0])
    assert again["seq"] == 2 and again["main_cpu_s"] < head["main_cpu_s"]


@pytest.mark.parametrize(
    "argv", [["--concurrency", "16,x"], ["--concurrency", "0"], ["--rounds", "0"]]
)
def test_bad_arguments_are_refused_before_anything_starts(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["stage_cpu", *argv])
    with pytest.raises(SystemExit) as exited:
        stage_cpu.main()
    assert exited.value.code == 2 and "--" in capsys.readouterr().err
