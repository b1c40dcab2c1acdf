"""Every benchmark still runs: ``python -m bench.<name> --quick`` exits 0 and its last line
is one JSON object. No thresholds: the figures are the full runs' business
(docs/benchmarks.md); this only keeps a benchmark from silently stopping working.

The benchmarks of the real stack (two vLLM servers and the default model) are ``e2e``:
each starts its own ``gearshift serve`` and keeps its quick run as short as it can.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NEEDS_SANDBOX = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or shutil.which("runsc") is None,
    reason="bench.sandbox needs root, bubblewrap and gVisor's runsc (./scripts/install.sh)",
)
NEEDS_BWRAP = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="the gateway's sandbox needs root and bubblewrap (./scripts/install.sh)",
)


def run_quick(name: str, *extra: str, timeout_s: float) -> dict[str, object]:
    """Run one benchmark's quick mode in its own process; its last line, parsed."""
    argv = [sys.executable, "-m", f"bench.{name}", "--quick", *extra]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    output = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, f"{' '.join(argv[1:])} exited with {proc.returncode}:\n{output}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"bench.{name} printed nothing:\n{output}"
    last = json.loads(lines[-1])
    assert isinstance(last, dict), f"bench.{name}'s last line is not a JSON object: {lines[-1]}"
    return last


@pytest.mark.parametrize(
    ("name", "extra", "timeout_s"),
    [
        ("token_arrays", (), 60),
        ("agent_metrics", (), 120),
        ("writer_first_steps", (), 120),
        ("writer_frames", (), 120),
        ("writer_sync", (), 120),
        ("record_encoding", (), 60),
        # one operator gateway, two cells of 100 agent-body requests at concurrency 1
        ("c1_stalls", (), 300),
        # two operator gateways (writer at idle priority / at niceness 10), one round
        ("writer_priority", (), 300),
        ("stream_relay", (), 60),
        ("http_clients", (), 120),
        ("router_latency", (), 120),
        ("router_offpolicy", (), 300),
        # a minute or two each on a quiet machine; several times that on a busy one
        ("recorder", (), 900),
        # two gateway processes per store, SQLite and a throwaway PostgreSQL
        ("admission", (), 900),
        # one sampled gateway (bench.stage_sampler in its process), one small round
        ("stage_cpu", (), 600),
    ],
)
def test_quick_run(name: str, extra: tuple[str, ...], timeout_s: float) -> None:
    run_quick(name, *extra, timeout_s=timeout_s)


@pytest.mark.skipif(
    subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode
    != 0,
    reason="not a git checkout: no revision to compare with",
)
def test_revisions_quick_run() -> None:
    # two operator gateways, this checkout's and HEAD's (a worktree), one round
    out = run_quick("revisions", "--base", "HEAD", timeout_s=300)
    assert {"ratio_cpu_agent_c64", "head_lower_cpu_chat_c1"} <= out.keys()


def test_gateway_overhead_quick_run(tmp_path: Path) -> None:
    # LiteLLM would be installed from PyPI: the comparison is the full run's. The recording
    # gateway runs under the stall probe, so that it keeps working too.
    probe = tmp_path / "probe.jsonl"
    last = run_quick("gateway_overhead", "--no-litellm", "--probe", str(probe), timeout_s=900)
    keys = {"cpu_ms_per_req_agent_session", "added_p99_ms_agent_session", "max_stall_ms",
            "stream_max_stall_ms", "cpu_ms_per_req_recording", "cpu_ms_per_req"}  # fmt: skip
    assert keys <= set(last)
    assert "probe" in last["probe"]["events"]  # type: ignore[index, operator]


def test_router_eval_quick_run() -> None:
    last = run_quick("router_eval", timeout_s=300)
    keys = {"auc_heldout_family", "apgr_heldout_family", "apgr_best_baseline_heldout_family",
            "auc_test_split", "apgr_test_split", "rules_heldout_family", "split_sha256"}  # fmt: skip
    assert keys <= set(last) and keys - {"split_sha256"} <= set(last["sampled"])  # type: ignore[arg-type]
    assert last["best_baseline_heldout_family"] in {"always_full", "always_fast", "length_threshold", "rules", "group_lookup"}  # fmt: skip


def test_kv_compaction_quick_run() -> None:
    pytest.importorskip("torch", reason="bench.kv_compaction needs torch (the kernels extra)")
    run_quick("kv_compaction", timeout_s=300)


@NEEDS_SANDBOX
def test_sandbox_quick_run() -> None:
    run_quick("sandbox", timeout_s=300)


@NEEDS_BWRAP
def test_sandbox_usage_quick_run() -> None:
    last = run_quick("sandbox_usage", timeout_s=300)
    assert {"before", "kernel"} <= set(last["usage"]) and {"direct", "frames"} <= set(last["hop"])  # type: ignore[operator]


@NEEDS_BWRAP
def test_agent_loop_quick_run() -> None:
    last = run_quick("agent_loop", timeout_s=600)
    assert {"iteration_overhead_p50_ms", "iteration_overhead_p99_ms", "chain50_load_p50_ms"} <= set(
        last
    )


@pytest.mark.e2e
# bench.tiers --quick runs against the session's stack in tests/e2e/test_tiers_quick.py
@pytest.mark.parametrize("name", ["token_estimate", "router_outcomes"])
def test_real_stack_quick_run(name: str, tmp_path: Path) -> None:
    # router_outcomes appends to the file it is given (never the shipped outcomes here)
    extra = ("--out", str(tmp_path / "outcomes.jsonl")) if name == "router_outcomes" else ()
    run_quick(name, *extra, timeout_s=1800)
