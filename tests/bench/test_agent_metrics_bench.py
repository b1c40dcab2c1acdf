"""``bench.agent_metrics`` sizes the exporter's cost at its default cadence, which it may
not import (bench stays off the web layer): the two must agree."""

from __future__ import annotations

from bench.agent_metrics import EVERY_S
from gateway.http.routes import agents


def test_the_bench_knows_the_exporters_cadence() -> None:
    assert set(EVERY_S) == set(agents.EXPORTED_WINDOWS)
    for window, ticks in agents.REFRESH_TICKS.items():
        assert EVERY_S[window] == agents.METRICS_EVERY_S * ticks
