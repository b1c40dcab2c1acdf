"""This checkout's gateway against another revision's, side by side in one run.

A change worth a few percent of a request's CPU is below what separate runs of
``bench.gateway_overhead`` can show on a shared machine: the same code's CPU a request moves
by 10-25 % between runs. Here two operator gateways (``bench.proxies.start_gearshift``: API
keys, router, sandbox, recording to SQLite) run at once on the proxy core: ``head``, this
checkout, and ``base``, the revision ``--base`` names, checked out in a temporary git
worktree whose code the base gateway and its child processes (the recorder's writer, the
sandbox) run. Each round sends every kind of cell to both, in alternating order, so the
machine's drift falls on both alike: 1,000 non-streamed requests at concurrency 1 with the
chat body (2 messages) and with the agent body (30 messages, 39 KB), then 2,000 agent-body
requests at concurrency 64 (CPU a request and requests/s until the recorder has written
everything). Added p99 is the gateway's p99 less the bare mock's, measured first.

The base revision must take the configuration this checkout's ``bench.proxies`` writes, and
runs in this checkout's environment (its own dependencies are not installed).

    python -m bench.revisions --base REV [--quick] [--rounds N] [--requests N]

Last line: one JSON object: the medians over rounds per arm and kind, the ratios head /
base (``ratio_cpu_<kind>``, ``ratio_added_p99_ms_<kind>``, ``ratio_sustained_rps_agent_c64``)
and in how many rounds head's CPU a request was the lower (``head_lower_cpu_<kind>``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import side_by_side
from bench.proxies import start_gearshift

ARMS = ("head", "base")
REPO = Path(__file__).resolve().parents[1]


def worktree(rev: str, where: Path) -> str:
    """Check ``rev`` out at ``where`` (detached); its full commit id."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(where), commit],
        check=True,
    )  # fmt: skip
    found = subprocess.run(  # as start_gearshift(code=...) starts it
        [sys.executable, "-c", "import gateway; print(gateway.__file__)"],
        check=True, capture_output=True, text=True, cwd=where,
        env={**os.environ, "PYTHONPATH": str(where)},
    ).stdout.strip()  # fmt: skip
    if not Path(found).resolve().is_relative_to(where.resolve()):
        raise RuntimeError(f"the base gateway would run {found}, not the worktree's code")
    return commit


def starter(arm: str, code: Path | None) -> side_by_side.Starter:
    """Start ``arm``'s operator gateway, from ``code`` (a worktree) when given."""
    return lambda tmp, mock_url: start_gearshift(
        tmp, mock_url, f"gearshift_{arm}", operator=True, code=code
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare with (git rev)")
    args, rounds, cells = side_by_side.parse(parser)
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-revisions-") as tmpdir:
        tmp = Path(tmpdir)
        code = tmp / "base-code"
        try:
            commit = worktree(args.base, code)
            arms = {arm: starter(arm, code if arm == "base" else None) for arm in ARMS}
            results, upstream = side_by_side.run(tmp, arms, rounds, cells)
        finally:  # (also after a failed check: the worktree is registered by then)
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(code)],
                check=False, capture_output=True,
            )  # fmt: skip
    summary = side_by_side.summarize(results, upstream, "head", "base")
    summary.update(base=commit, rounds=rounds, requests=cells["chat_c1"][1])
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
