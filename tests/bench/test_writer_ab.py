"""``bench.recorder --writer-ab``: the writer as it was and as it is, on the same frames."""

from __future__ import annotations

from bench.writer_chain import lookup_ab
from gateway.recording import batch, tool_calls


def test_the_writer_ab_runs_both_writers_and_restores_the_current_one(tmp_path):
    inserts, prefetch_ids = batch.insert_rows, tool_calls.PREFETCH_IDS
    got = lookup_ab(tmp_path, quick=True)
    assert len(got["writer_ab"]) == 2
    assert all(r["was_us"] > 0 and r["now_us"] > 0 for r in got["writer_ab"])
    assert batch.insert_rows is inserts
    assert prefetch_ids == tool_calls.PREFETCH_IDS
