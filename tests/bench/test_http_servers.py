"""bench.http_servers: its order and arithmetic, and its quick run (uvicorn against granian,
which comes with the ``bench`` extra; the figures: docs/decisions/http-server.md)."""

from __future__ import annotations

import importlib.util

import pytest

from bench.http_servers import SERVERS, VOLATILE, order, summarize
from tests.bench.test_quick import run_quick


def test_the_servers_alternate_round_by_round():
    assert [order(r) for r in range(3)] == [SERVERS, SERVERS[::-1], SERVERS]


def test_only_the_answers_id_and_created_are_masked():
    answer = b'{"id":"chatcmpl-1","created":1712,"model":"mock-full","choices":[{"id":"x1"}]}'
    masked = VOLATILE.sub(rb'"\1":_', answer)
    assert masked == b'{"id":_,"created":_,"model":"mock-full","choices":[{"id":_}]}'


def row(cpu: float, tree: float) -> dict[str, float]:
    return {"cpu_ms": cpu, "tree_cpu_ms": tree, "p50_ms": 2.0, "p99_ms": 5.0,
            "added_p50_ms": 1.0, "added_p99_ms": 3.0, "rps": 100.0, "errors": 0}  # fmt: skip


def test_the_summary_takes_medians_over_rounds_and_the_paired_c16_ratio():
    cell = {
        "upstream": [row(float("nan"), float("nan"))] * 3,
        "uvicorn": [row(2.0, 3.0), row(1.0, 2.0), row(9.0, 9.0)],  # median 2.0 / 3.0
        "granian": [row(1.0, 2.0), row(1.5, 1.5), row(0.5, 9.0)],  # median 1.0 / 2.0
    }
    summary = summarize({"plain_c1": cell, "plain_c16": cell})
    assert summary["cells"]["plain_c16"]["uvicorn"]["cpu_ms"] == 2.0
    assert summary["cells"]["plain_c16"]["cpu_ratio_by_round"] == [0.5, 1.5, 0.056]
    assert summary["cpu_ratio_granian_vs_uvicorn"] == 0.5  # per round 0.5, 1.5, 0.056
    assert summary["cpu_ratio_granian_vs_uvicorn_tree"] == 0.75  # per round 0.667, 0.75, 1
    assert summary["errors"] == {"uvicorn": 0, "granian": 0}


@pytest.mark.skipif(
    importlib.util.find_spec("granian") is None, reason="granian: pip install -e '.[bench]'"
)
def test_quick_run():
    last = run_quick("http_servers", timeout_s=900)
    assert last["answers_same"] is True
    assert set(last["cells"]) == {"plain_c1", "plain_c16", "stream_c16"}
    assert last["errors"] == {"uvicorn": 0, "granian": 0}
    assert set(last["sandbox"]) == {"uvicorn", "granian"}
    assert last["cpu_ratio_granian_vs_uvicorn"] > 0
