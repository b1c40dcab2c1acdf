"""The proxies bench.gateway_overhead measures, each started on its own core before the mock.

* ``gearshift``: the light configuration (API keys, router; recording and sandbox off);
* ``gearshift_op``: as an operator runs it: API keys, the default router, recording to
  SQLite, the tool sandbox enabled (it starts where the machine can isolate: root and
  bubblewrap; elsewhere ``gearshift serve`` says so and runs without it);
* ``litellm``: LiteLLM's proxy (``litellm[proxy]``, pinned below, installed on first use
  into its own virtualenv under $GEARSHIFT_HOME), one worker, master key set.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.procs import pinned, start, wait_http

LITELLM_VERSION = "1.108.7"
# The proxy's core and the mock's and load generator's; GEARSHIFT_BENCH_CORES=0,0 keeps a
# run off core 1 (while something else measures there)
GEARSHIFT_CORE, CLIENT_CORE = (
    int(c) for c in os.environ.get("GEARSHIFT_BENCH_CORES", "0,1").split(",")
)
KEY = "sk-bench-" + secrets.token_hex(16)
HOME = Path(os.environ.get("GEARSHIFT_HOME", Path.home() / ".cache" / "gearshift"))
SANDBOX_DOWN = ("tool sandbox not started", "tool sandbox did not start")


@dataclass
class Target:
    name: str
    url: str  # chat completions URL
    model: str
    proc: subprocess.Popen[bytes] | None  # None: the bare upstream (no proxy process)
    key: str = "unused"
    log: Path | None = None
    metrics: str | None = None  # where a recording gateway reports its recorder's queue


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_litellm() -> Path:
    venv = HOME / "bench-litellm"
    exe = venv / "bin" / "litellm"
    stamp = venv / ".gearshift-stamp"
    if exe.exists() and stamp.exists() and stamp.read_text() == LITELLM_VERSION:
        return exe
    print(
        f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} (once, a few minutes)",
        flush=True,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "pip"), "install", "--progress-bar", "on"]
    subprocess.run([*pip, f"litellm[proxy]=={LITELLM_VERSION}"], check=True)
    stamp.write_text(LITELLM_VERSION)
    return exe


def gearshift_config(
    tmp: Path, port: int, mock_url: str, operator: bool, store_options: str = ""
) -> str:
    """``store_options``: more of the operator's ``store`` section, e.g. ``writer_idle:
    false`` (YAML flow-mapping entries)."""
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    config = (
        f"port: {port}\n"
        f"auth: {{mode: keys, keys: [{{name: bench, tenant: bench, sha256: '{digest}'}}]}}\n"
        f"tiers:\n  full: {{model: mock-full, replicas: ['{mock_url}']}}\n"
        f"  fast: {{model: mock-fast, replicas: ['{mock_url}']}}\n"
    )
    if operator:  # the defaults, with the store's files where this run can delete them
        return config + (
            f"store: {{enabled: true, url: 'sqlite:///{tmp}/trajectories.db', "
            f"dead_letter_path: '{tmp}/dead-letter.jsonl'"
            f"{', ' + store_options if store_options else ''}}}\n"
            "sandbox: {enabled: true}\n"
        )
    # Like for like with LiteLLM, which records nothing and runs no tools.
    return config + "store: {enabled: false}\nsandbox: {enabled: false}\n"


def start_gearshift(
    tmp: Path, mock_url: str, name: str, operator: bool, probe: Path | None = None,
    wrap: tuple[str, Path] | None = None, store_options: str = "", code: Path | None = None,
) -> Target:  # fmt: skip
    """``probe``: run it under bench.stall_probe, its events appended to this file;
    ``wrap``: under another such module (``python -m MODULE FILE -- serve ...``, e.g.
    bench.stage_sampler), given this file; ``code``: another checkout of the repository
    (a git worktree) whose code the gateway and its child processes run: first on their
    path, and their working directory (``python -m`` puts it first)."""
    port = free_port()
    config = tmp / f"{name}.yaml"
    config.write_text(gearshift_config(tmp, port, mock_url, operator, store_options))
    gearshift = [str(Path(sys.executable).with_name("gearshift"))]
    if probe is not None:
        wrap = ("bench.stall_probe", probe)
    if wrap is not None:
        gearshift = [sys.executable, "-m", wrap[0], str(wrap[1]), "--"]
    log = tmp / f"{name}.log"
    argv = [*gearshift, "--log-level", "warning", "serve", "--config", str(config)]
    env = None if code is None else {"PYTHONPATH": str(code)}
    proc = start(pinned(argv, GEARSHIFT_CORE), log, env=env, cwd=code)
    wait_http(f"http://127.0.0.1:{port}/ready", proc, log, timeout_s=600)  # a busy machine
    base = f"http://127.0.0.1:{port}"
    metrics = base + "/metrics" if operator else None
    return Target(name, base + "/v1/chat/completions", "auto", proc, KEY, log, metrics)


def metric_sum(metrics_url: str, names: tuple[str, ...]) -> float:
    """The sum of the samples of ``names`` (every label set) in a gateway's /metrics."""
    total = 0.0
    with urllib.request.urlopen(metrics_url, timeout=120) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(names):
                total += float(line.rsplit(" ", 1)[1])
    return total


def recorder_done(metrics_url: str) -> float:
    """Steps the gateway's recorder has written or given up on, from its /metrics."""
    return metric_sum(
        metrics_url, ("gearshift_recorder_written_total", "gearshift_recorder_dropped_total")
    )


def drain(target: Target, expected: float, timeout_s: float = 600, idle_s: float = 5) -> float:
    """Wait until the recorder has written ``expected`` steps in all (or written nothing
    for ``idle_s``): the writer's CPU belongs to the requests just measured, not to the
    next cell's. Returns the seconds it took."""
    started = last_change = time.monotonic()
    done = -1.0
    while target.metrics and time.monotonic() - started < timeout_s:
        now_done = recorder_done(target.metrics)
        if now_done >= expected:
            break
        if now_done != done:
            done, last_change = now_done, time.monotonic()
        elif time.monotonic() - last_change > idle_s:
            break
        time.sleep(0.05)
    return time.monotonic() - started


def sandbox_state(target: Target) -> str:
    """'on', or 'off' and why, from what ``gearshift serve`` logged at start-up."""
    assert target.log is not None
    for line in target.log.read_text(errors="replace").splitlines():
        for marker in SANDBOX_DOWN:
            if marker in line:
                return "off: " + line[line.index(marker) :].strip()[:200]
    return "on"


def start_litellm(tmp: Path, mock_url: str) -> Target:
    exe = ensure_litellm()
    port = free_port()
    cfg = tmp / "litellm.yaml"
    cfg.write_text(
        "model_list:\n  - model_name: auto\n    litellm_params:\n"
        f"      model: openai/mock\n      api_base: {mock_url}/v1\n      api_key: sk-mock\n"
        "litellm_settings:\n  telemetry: false\n"
        f"general_settings:\n  master_key: {KEY}\n"
    )
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
           "LITELLM_TELEMETRY": "False"}  # fmt: skip
    log = tmp / "litellm.log"
    argv = [str(exe), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1"]  # fmt: skip
    proc = start(pinned(argv, GEARSHIFT_CORE), log, env)
    wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc, log, timeout_s=300)
    return Target("litellm", f"http://127.0.0.1:{port}/v1/chat/completions", "auto", proc, KEY, log)
