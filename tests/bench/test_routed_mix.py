"""The routed mix's parts that need no model: the CPU time of a stack's process tree read from
/proc, the router's threshold knob, the dev-split sweep that picks the operating point, the
test-split replay from stored outcomes (a small fixture file) and its baselines, the per-arm
figures, and the refusals of the command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.mix_arms import FULL_X2, Outcome, arm_figures
from bench.mix_cpu import StackCpu, TreesCpu, serve_pid, server_pid, tree
from bench.mix_replay import Routed, agreement, decisions, operating_point, router_params, sweep
from bench.mix_stored import lookup_tiers, random_mix
from bench.routed_mix import main, summarize
from bench.router_tasks import Task
from bench.tier_prompts import per_family, split_tasks
from router import RouteRequest, build_policy
from router.classifier import DEFAULT_SAMPLED_MODEL, Classifier
from router.training import Example

# burns argv[1] CPU-seconds, then waits to be killed
BURN = (
    "import sys, time\nend = time.process_time() + float(sys.argv[-1])\n"
    "while time.process_time() < end:\n    pass\ntime.sleep(60)\n"
)


def test_stack_cpu_charges_the_serve_process_and_its_children(tmp_path: Path):
    """A stand-in ``gearshift serve --port N`` that starts a child; both burn CPU."""
    child = tmp_path / "child.py"
    child.write_text(BURN)
    launcher = tmp_path / "gearshift"
    launcher.write_text(
        f"import subprocess, sys\nsubprocess.Popen([sys.executable, {str(child)!r}, '0.2'])\n"
        + BURN
    )
    proc = subprocess.Popen([sys.executable, str(launcher), "serve", "--port", "54321", "0.15"])
    pids = [proc.pid]
    try:
        deadline = time.monotonic() + 30
        while len(pids := tree(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu = StackCpu(54321)
        assert cpu.root == proc.pid and cpu.processes() == 2
        seconds = cpu.seconds()
        while seconds is not None and seconds < 0.33 and time.monotonic() < deadline:
            time.sleep(0.05)
            seconds = cpu.seconds()
        assert seconds is not None and 0.33 <= seconds < 3  # both burns, and little else
        assert serve_pid(54322) is None and StackCpu(54322).seconds() is None
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_server_pid_and_trees_cpu_charge_a_tier_server_and_another_tree(tmp_path: Path):
    """A stand-in stack whose child is started like a tier's vLLM server (``--port M``),
    and a separate process: ``server_pid`` finds the child, ``TreesCpu`` sums both trees."""
    child = tmp_path / "child.py"
    child.write_text(BURN)
    launcher = tmp_path / "gearshift"
    server = [str(child), "vllm.entrypoints.openai.api_server", "--port", "54324", "0.2"]
    launcher.write_text(f"import subprocess, sys\nsubprocess.Popen([sys.executable, *{server!r}])\n" + BURN)  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(launcher), "serve", "--port", "54323", "0"])
    other = subprocess.Popen([sys.executable, str(child), "0.15"])
    pids = [proc.pid, other.pid]
    try:
        deadline = time.monotonic() + 30
        # until the child has exec'd: a forked child shows the launcher's argv until then
        while (
            len(pids := [*tree(proc.pid), other.pid]) < 3 or server_pid(proc.pid, 54324) is None
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
        found = server_pid(proc.pid, 54324)
        assert found is not None and found != proc.pid and server_pid(proc.pid, 54325) is None
        cpu = TreesCpu([found, other.pid])
        assert cpu.found and cpu.processes() == 2
        seconds = cpu.seconds()
        while seconds is not None and seconds < 0.33 and time.monotonic() < deadline:
            time.sleep(0.05)
            seconds = cpu.seconds()
        assert seconds is not None and 0.33 <= seconds < 3  # both burns, not the launcher's
        assert not TreesCpu([found, None]).found and TreesCpu([found, None]).seconds() is None
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        proc.wait()
        other.wait()


def test_router_params_set_the_default_chains_classifier_threshold():
    policy, params = router_params(0.3)
    assert policy == "session"
    assert params["base"] == "rules" and params["base_params"]["base"] == "classifier"
    assert params["base_params"]["base_params"] == {"threshold": 0.3}
    body = {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "temperature": 0}
    low = build_policy(*router_params(0.0)).decide(RouteRequest("chat", body))
    high = build_policy(*router_params(1.0)).decide(RouteRequest("chat", body))
    assert (str(low.tier), low.threshold) == ("full", 0.0)
    assert (str(high.tier), high.threshold) == ("fast", 1.0)
    assert router_params()[1] == router_params(None)[1] and "threshold" not in str(router_params()[1])  # fmt: skip


def test_sweep_picks_the_most_fast_steps_that_keep_the_quality():
    routed = {
        "a": Routed("full", True, 0.8, 0.5),
        "b": Routed("fast", True, 0.4, 0.5),
        "c": Routed("fast", True, 0.2, 0.5),
        "d": Routed("full", False, None, None),  # a rule decided: no threshold moves it
    }
    full = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0}
    fast = {"a": 0.0, "b": 1.0, "c": 1.0, "d": 0.0}
    sources = dict.fromkeys(routed, "s")
    rows = sweep(routed, full, fast, sources, [0.1, 0.3, 0.5, 0.9], boot=50)
    by_t = {r["threshold"]: r for r in rows}
    assert [by_t[t]["fast_share"] for t in (0.1, 0.3, 0.5, 0.9)] == [0, 0.25, 0.5, 0.75]
    # at 0.5 b and c go fast: b keeps its 1, c gains 1 -> 4 / 3 of always-full's 3
    assert by_t[0.5]["quality_vs_full"] == pytest.approx(4 / 3, abs=1e-3)
    assert by_t[0.9]["quality_vs_full"] == pytest.approx(1.0, abs=1e-3)  # a loses its 1
    assert operating_point(rows) == 0.9
    assert operating_point(rows, keep=1.2) == 0.5
    assert operating_point(rows, keep=2.0) is None
    assert agreement(routed, {"a": "full", "b": "full", "x": "fast"}) == 0.5


def test_arm_figures_count_router_choices_and_escalations():
    outs = [
        Outcome("a", 1.0, 200, {"content": "x"}, "fast", "classifier: p(full)=0.10 < 0.48"),
        Outcome("b", 3.0, 200, {"content": "x"}, "full", "classifier: ...; escalated to full: cut"),
        Outcome("c", 2.0, 200, {"content": "x"}, "full", "classifier: p(full)=0.90 >= 0.48"),
        Outcome("d", 6.0, 504, None, "full", ""),  # timed out: not completed
    ]
    fig = arm_figures({"out": outs, "cpu_s": 6.0, "wall_s": 4.0, "scores": {"a": 1, "b": 0, "c": 1, "d": 0}})  # fmt: skip
    assert fig["completed"] == 3 and fig["tasks_per_cpu_s"] == 0.5 and fig["tasks_per_s"] == 0.75
    assert fig["s_per_task_mean"] == 3.0 and fig["s_per_task_p50"] == 2.5
    assert fig["tier_share"] == {"full": 0.5, "fast": 0.5} and fig["escalated"] == 1
    assert fig["quality"] == 0.5


@pytest.mark.parametrize(
    "argv",
    [
        ["--thresholds", "0.3,0.5"],  # tuning on the locked test split
        ["--url", "http://127.0.0.1:9", "--threshold", "0.4"],
        ["--url", "http://127.0.0.1:9", "--full-x2"],  # it starts a replica beside a stack
        ["--per-family", "-1"],
        ["--concurrency", "0"],
    ],
)
def test_refused_command_lines(argv):
    with pytest.raises(SystemExit):
        main(argv)


def test_sweep_from_stored_outcomes_names_a_dev_operating_point(capsys):
    """The sweep on the committed outcomes of both tiers: dev tasks only, no servers."""
    result = main(["--side", "dev", "--per-family", "1", "--thresholds", "0.0,0.5,1.0",
                   "--outcomes-from", "bench/data/router_outcomes.jsonl", "--boot", "50"])  # fmt: skip
    assert result["side"] == "dev" and result["tasks"] == 13  # one per family, all stored
    shares = [row["fast_share"] for row in result["sweep"]]
    assert shares[0] == 0 and shares == sorted(shares)  # a higher threshold: more fast steps
    assert result["sweep"][0]["quality_vs_full"] == 1.0  # threshold 0: always full
    assert result["operating_point"] in (0.0, 0.5, 1.0)
    assert result["tasks_per_cpu_s_ratio"] is None  # nothing was run
    assert "13 of 13 dev tasks" in capsys.readouterr().err


def test_summary_reports_routed_against_two_full_replicas():
    """With the full-x2 arm measured, routed's time per task and tasks per CPU-second are
    also given over it, and the arm's own figures against always-full; without it, None."""
    tasks = [Task(i, "s", "c", None, {}, None) for i in "ab"]
    ok = {"content": "x"}

    def tally(seconds: float, cpu_s: float, tier: str, scores: dict[str, float]) -> dict:
        outs = [Outcome(i, seconds, 200, ok, tier, "") for i in "ab"]
        return {"out": outs, "cpu_s": cpu_s, "wall_s": 2 * seconds, "scores": scores}

    full = tally(4.0, 8.0, "full", {"a": 1.0, "b": 1.0})
    runs = {"routed": tally(2.0, 4.0, "fast", {"a": 1.0, "b": 0.0}), "full": full,
            "fast": tally(1.0, 2.0, "fast", {"a": 0.0, "b": 0.0})}  # fmt: skip
    args = argparse.Namespace(boot=20, side="test", quick=False, per_family=2, concurrency=4, threshold=None)  # fmt: skip
    without = summarize(tasks, runs, args)
    assert without["time_per_task_ratio"] == 0.5 and without["tasks_per_cpu_s_ratio"] == 2.0
    assert without["time_per_task_ratio_vs_full_x2"] is None
    assert without["tasks_per_cpu_s_ratio_vs_full_x2"] is None
    assert without["baseline_full_x2"] is None and FULL_X2 not in without["arms"]

    x2 = tally(2.5, 10.0, "full", {"a": 1.0, "b": 1.0})  # half the CPU-rate per task of full
    result = summarize(tasks, {**runs, FULL_X2: x2}, args)
    assert result["time_per_task_ratio_vs_full_x2"] == 0.8  # 2.0 s over 2.5 s
    assert result["tasks_per_cpu_s_ratio_vs_full_x2"] == 2.5  # 0.5 over 0.2 tasks/CPU-s
    assert result["time_per_task_ratio"] == 0.5  # still over the one-replica full arm
    assert result["baseline_full_x2"]["time_per_task_ratio"] == 0.625
    assert result["baseline_full_x2"]["quality_vs_full"] == 1.0
    assert result["arms"][FULL_X2]["tasks_per_cpu_s"] == 0.2


def _outcomes(
    path: Path, head: dict, rows: dict[str, tuple[dict, dict]], tasks: list[Task]
) -> Path:
    lines = [json.dumps(head)]
    lines += [json.dumps({"key": t.key, "id": t.id, "full": rows[t.id][0], "fast": rows[t.id][1]}) for t in tasks]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def test_replay_on_the_test_split_at_the_models_own_thresholds(tmp_path: Path, capsys):
    """One test task per family with stored outcomes of both tiers, built so that the fast
    tier gets exactly the tasks the router sends it right, with three times the tokens:
    the replay must give the mix always-full's quality, and the token and baseline figures
    follow from the fast share alone."""
    tasks = per_family(split_tasks("test"), 1)
    dev = per_family(split_tasks("dev"), 1)
    greedy = decisions({t.id: {**t.body, "model": "auto", "temperature": 0, "seed": 0} for t in tasks})  # fmt: skip
    fast_ids = {i for i, r in greedy.items() if r.tier == "fast"}
    n, k = len(tasks), len(fast_ids)
    assert 0 < k < n  # the router splits these
    rows = {t.id: ({"score": 1.0, "tokens": 10, "seconds": 1.0},
                   {"score": float(t.id in fast_ids), "tokens": 30 if t.id in fast_ids else 10, "seconds": 1.0})
            for t in [*tasks, *dev]}  # fmt: skip
    head = {"samples": 1, "temperature": 0.0, "full_from": "earlier.jsonl"}
    g = _outcomes(tmp_path / "greedy.jsonl", head, rows, [*tasks, *dev])
    s = _outcomes(tmp_path / "sampled.jsonl", {"samples": 4, "temperature": 0.7}, rows, [*tasks, *dev])  # fmt: skip
    result = main(["--outcomes-from", str(g), "--outcomes-from", str(s), "--boot", "50"])
    share = k / n
    assert result["mode"] == "replay" and result["side"] == "test" and result["tasks"] == n
    assert result["tasks_per_cpu_s_ratio"] is None and result["time_per_task_ratio"] is None
    assert result["headline_regime"] == "greedy" and result["fast_share"] == round(share, 3)
    assert result["quality_vs_full"] == 1.0 and result["quality_vs_full_ci_low"] == 1.0
    assert result["token_ratio"] == round(1 + 2 * share, 3)  # 30 instead of 10 on k of n
    assert result["fast_token_ratio_routed"] == 3.0
    assert result["baseline_fast"]["quality_vs_full"] == round(share, 3)
    g_fig = result["regimes"]["greedy"]
    assert g_fig["missing"] == len(split_tasks("test")) - n and len(g_fig["per_family"]) == n
    assert g_fig["thresholds"] == [round(Classifier.load().threshold, 4)]
    mix = g_fig["baselines"]["random_mix"]
    assert mix["quality_vs_full"] == round(1 - share + share * share, 3)
    assert mix["token_ratio"] == round(1 + 2 * share * share, 3)  # always-fast writes 1 + 2s
    assert g_fig["baselines"]["group_lookup"]["fast_share"] == round(share, 3)
    sampled = result["regimes"]["sampled"]  # temperature 0.7: the sampled model decided
    assert (sampled["samples"], sampled["temperature"]) == (4, 0.7)
    assert sampled["thresholds"] == [round(Classifier.load(DEFAULT_SAMPLED_MODEL).threshold, 4)]
    assert result["seconds_comparable"] is False
    assert "greedy.jsonl took the full tier's answers from earlier.jsonl" in result["seconds_note"]
    err = capsys.readouterr().err
    assert f"greedy: {n} tasks" in err and "stored seconds are not comparable" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["--thresholds", "0.3,0.5"],  # the sweep on the test split
        ["--threshold", "0.4"],  # the replay runs the models' own thresholds
        ["--quick"],  # shortened requests match no stored outcome
        ["--outcomes-from", "bench/data/router_outcomes.jsonl"],  # one file per regime
    ],
)
def test_replay_refusals(argv):
    with pytest.raises(SystemExit):
        main(["--outcomes-from", "bench/data/router_outcomes.jsonl", *argv])


def test_random_mix_and_group_lookup_baselines():
    rows = {i: {"full": {"score": 1.0, "tokens": 10}, "fast": {"score": f, "tokens": 20}}
            for i, f in (("a", 1.0), ("b", 0.0), ("c", 1.0), ("d", 0.0))}  # fmt: skip
    ids = list(rows)
    assert random_mix(ids, rows, 0.0, 50)["quality_vs_full"] == 1.0
    half = random_mix(ids, rows, 0.5, 200)
    assert half["quality_vs_full"] == 0.75 and half["token_ratio"] == 1.5
    assert half["quality_vs_full_ci"][0] < 0.75 < half["quality_vs_full_ci"][1]
    train = [Example(f"x{i}", {}, 1.0, 0.0, "hard/x") for i in range(3)]
    train += [Example(f"y{i}", {}, 1.0, 1.0, "easy/y") for i in range(3)]
    test = [Example(i, {}, 0.0, 0.0, g) for i, g in (("p", "hard/x"), ("q", "easy/y"), ("r", "easy/y"), ("s", "new/z"))]  # fmt: skip
    # the easy group's rate is 0, an unseen source falls back to all (0.5): the easy go fast
    assert lookup_tiers(train, test, 0.0, 0.5) == {"p": "full", "q": "fast", "r": "fast", "s": "full"}  # fmt: skip
    assert set(lookup_tiers(train, test, 0.0, 0.75).values()) == {"fast", "full"}
