"""The routed mix replayed from stored outcomes of both tiers: no servers, no CPU figures.

    python -m bench.routed_mix --outcomes-from bench/data/router_outcomes.jsonl \
        --outcomes-from bench/data/router_outcomes_sampled.jsonl      # every test task
    python -m bench.routed_mix --side dev --thresholds 0.3,0.4,0.4755 \
        --outcomes-from bench/data/router_outcomes.jsonl              # the dev sweep

Each outcomes file (``bench.router_outcomes``) is one regime, named by its header: one
greedy answer per task and tier, or the mean score of ``samples`` answers at
``temperature``. The default chain (``bench.mix_replay.decisions``, in process) routes each
task's request as that regime sends it — ``temperature: 0``, or the file's temperature and
``n``, so the sampled model scores the sampled requests — and a task routed to a tier gets
that tier's stored score and completion tokens (greedy answers are deterministic per tier).

**Replay** (no ``--thresholds``; the only mode on the locked test split): the chain at the
thresholds its models ship with, nothing swept or tuned, over every task of the side with a
stored row. Per regime, overall and per family (``bench.router_split.family``):

* ``quality_vs_full``: the mix's summed score over always-full's, paired per task, with a
  95% bootstrap interval (``bench.tier_quality.retention``), and ``fast_share``;
* ``token_ratio``: the mix's completion tokens over always-full's on the same tasks;
  ``fast_token_ratio``: always-fast's over always-full's; ``fast_token_ratio_routed``: the
  same on the tasks the router sent to the fast tier. Above 1 the fast tier writes more than
  the full tier would have: a step sent to it costs more decode steps, not fewer;
* beside it, on the same tasks: **always-fast**; a **random mix** at the router's fast share
  (its expected quality and tokens; the interval resamples tasks and flips the coins); and
  the **group lookup** (``bench.router_lofo.group_lookup``: each task scored by its group's
  rate of "needs full" among the *dev* tasks of the same file, under the shipped model's
  label margin), sending the same share of tasks — its lowest-scored — to the fast tier.

Not replayed: the gateway's escalation of a failed fast answer (it can only raise the mix's
quality; it adds the full tier's tokens to the fast tier's) and time. The stored ``seconds``
are no per-answer speed: the collector asks both tiers for a task at once with several
tasks in flight on a shared machine, and a file made with ``--full-from`` took the full
tier's answers from an earlier run. So ``tasks_per_cpu_s_ratio`` and the time ratios are
None (``"mode": "replay"``); ``bench.routed_mix`` without ``--outcomes-from`` measures them.

**Sweep** (``--side dev --thresholds``, one file): ``bench.mix_replay.sweep`` at each
threshold, and the ``operating_point`` that keeps ``--keep`` of always-full's quality.
"""

from __future__ import annotations

import argparse
import random
import zlib
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.mix_replay import decisions, operating_point, sweep
from bench.router_lofo import group_lookup
from bench.router_outcomes import header, load
from bench.router_split import family
from bench.router_split import load as load_split
from bench.router_tasks import Task
from bench.tier_prompts import split_tasks
from bench.tier_quality import retention
from router.classifier import DEFAULT_MODEL, DEFAULT_SAMPLED_MODEL, Classifier
from router.training import DEFAULT_MARGIN, Example

Rows = Mapping[str, Mapping[str, Any]]  # task id -> stored row {"full": {...}, "fast": {...}}
MEASURED = ("tasks_per_cpu_s_ratio", "time_per_task_ratio", "time_per_task_ratio_vs_full_x2",
            "tasks_per_cpu_s_ratio_vs_full_x2")  # fmt: skip


@dataclass(frozen=True)
class Stored:
    """One outcomes file: how its answers were sampled, and its rows by task key."""

    path: Path
    samples: int
    temperature: float
    full_from: str | None
    rows: Rows

    @property
    def regime(self) -> str:
        return "greedy" if self.samples == 1 else "sampled"

    def request(self, task: Task) -> dict[str, Any]:
        """The task's request as this regime sends it, routed (``model: auto``)."""
        body = {**task.body, "model": "auto", "temperature": 0, "seed": 0}
        if self.samples > 1:
            body.update(temperature=self.temperature, n=self.samples)
        return body


def read(path: Path) -> Stored:
    if not path.is_file():
        raise SystemExit(f"--outcomes-from {path}: no such file")
    head, rows = header(path), load(path)
    # early files name no regime in their header: a sampled row lists its answers' scores
    samples = int(head.get("samples") or max((len(r["full"].get("scores", ())) for r in rows.values()), default=1) or 1)  # fmt: skip
    temperature = float(head.get("temperature", 0.7 if samples > 1 else 0.0))
    return Stored(path, samples, temperature, head.get("full_from"), rows)


def _over(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _tokens(rows: Rows, ids: Sequence[str], tier: Callable[[str], str]) -> int:
    return sum(int(rows[i][tier(i)]["tokens"]) for i in ids)


def mix_figures(
    ids: Sequence[str], rows: Rows, tiers: Mapping[str, str], sources: Mapping[str, str], boot: int
) -> dict[str, Any]:
    """Quality against always-full, fast share and completion-token ratios of a mix that
    sends each task to ``tiers[id]``."""
    pairs = [(sources[i], float(rows[i]["full"]["score"]), float(rows[i][tiers[i]]["score"])) for i in ids]  # fmt: skip
    q = retention(pairs, boot)
    fast = [i for i in ids if tiers[i] == "fast"]
    full_tokens = _tokens(rows, ids, lambda _: "full")
    return {
        "tasks": len(ids),
        "fast_share": round(len(fast) / len(ids), 3) if ids else None,
        "quality_vs_full": q["quality_retention"],
        "quality_vs_full_ci": q["ci"],
        "score_full": q["full"],
        "score_mix": q["candidate"],
        "token_ratio": _over(_tokens(rows, ids, tiers.__getitem__), full_tokens),
        "fast_token_ratio": _over(_tokens(rows, ids, lambda _: "fast"), full_tokens),
        "fast_token_ratio_routed": _over(
            _tokens(rows, fast, lambda _: "fast"), _tokens(rows, fast, lambda _: "full")
        ),
    }


def random_mix(ids: Sequence[str], rows: Rows, share: float, boot: int, seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Each task sent to the fast tier with probability ``share``: the expected quality
    against always-full and token ratio, and the quality's interval over tasks and coins."""
    full = [float(rows[i]["full"]["score"]) for i in ids]
    fast = [float(rows[i]["fast"]["score"]) for i in ids]
    rng, n, draws = random.Random(seed), len(ids), []
    for _ in range(boot if n else 0):
        picks = [rng.randrange(n) for _ in range(n)]
        denominator = sum(full[k] for k in picks)
        if denominator:
            draws.append(sum(fast[k] if rng.random() < share else full[k] for k in picks) / denominator)  # fmt: skip
    draws.sort()
    expect = sum(full) * (1 - share) + sum(fast) * share
    full_tokens = _tokens(rows, ids, lambda _: "full")
    mixed_tokens = full_tokens * (1 - share) + _tokens(rows, ids, lambda _: "fast") * share
    ci = [round(draws[int(0.025 * len(draws))], 3), round(draws[int(0.975 * len(draws)) - 1], 3)] if draws else None  # fmt: skip
    return {"tasks": n, "fast_share": round(share, 3), "quality_vs_full": _over(expect, sum(full)),
            "quality_vs_full_ci": ci, "token_ratio": _over(mixed_tokens, full_tokens)}  # fmt: skip


def lookup_tiers(train: Sequence[Example], test: Sequence[Example], margin: float, share: float) -> dict[str, str]:  # fmt: skip
    """The group lookup sending ``share`` of the test tasks, its lowest-scored, to the fast
    tier; ties (a group's tasks share one score) broken by a hash of the task id."""
    scores = group_lookup(train, test, margin)
    order = sorted(zip(scores, test, strict=True), key=lambda p: (p[0], zlib.crc32(p[1].id.encode())))  # fmt: skip
    k = round(share * len(test))
    return {e.id: "fast" if rank < k else "full" for rank, (_, e) in enumerate(order)}


def shipped_margin(regime: str) -> float:
    """The label margin the shipped model of ``regime`` was trained with."""
    spec = Classifier.load(DEFAULT_MODEL if regime == "greedy" else DEFAULT_SAMPLED_MODEL).spec
    return float(spec.get("training", {}).get("tuning", {}).get("margin", DEFAULT_MARGIN))


def _examples(tasks: Sequence[Task], stored: Stored) -> list[Example]:
    return [Example(t.id, t.body, float(r["full"]["score"]), float(r["fast"]["score"]), family(t))
            for t in tasks if (r := stored.rows.get(t.key)) is not None]  # fmt: skip


def replay_regime(stored: Stored, tasks: Sequence[Task], side: str, boot: int) -> dict[str, Any]:
    """The default chain at its shipped thresholds on ``tasks``, from one file's outcomes."""
    have = [t for t in tasks if t.key in stored.rows]
    if not have:
        raise SystemExit(f"--outcomes-from {stored.path}: no {side} task has a stored outcome")
    rows = {t.id: stored.rows[t.key] for t in have}
    routed = decisions({t.id: stored.request(t) for t in have})
    tiers = {i: r.tier for i, r in routed.items()}
    sources = {t.id: t.source for t in have}
    ids = [t.id for t in have]
    families: dict[str, list[str]] = defaultdict(list)
    for t in have:
        families[family(t)].append(t.id)
    failed = {tier: sum("error" in rows[i][tier] for i in ids) for tier in ("full", "fast")}
    return {
        **mix_figures(ids, rows, tiers, sources, boot),
        "file": str(stored.path),
        "samples": stored.samples,
        "temperature": stored.temperature,
        "missing": len(tasks) - len(have),
        "failed": failed,  # server errors, scored 0 with 0 tokens
        "by_rule": sum(not r.by_classifier for r in routed.values()),
        "thresholds": sorted(
            {
                round(r.threshold, 4)
                for r in routed.values()
                if r.by_classifier and r.threshold is not None
            }
        ),
        "per_family": {
            f: mix_figures(fids, rows, tiers, sources, boot) for f, fids in sorted(families.items())
        },
        "baselines": baselines(stored, have, tiers, side, boot),
    }


def baselines(stored: Stored, have: Sequence[Task], tiers: Mapping[str, str], side: str, boot: int) -> dict[str, Any]:  # fmt: skip
    """Always-fast, a random mix and the group lookup, the last two at the mix's fast share."""
    rows = {t.id: stored.rows[t.key] for t in have}
    sources = {t.id: t.source for t in have}
    ids = [t.id for t in have]
    share = sum(tiers[i] == "fast" for i in ids) / len(ids)
    out: dict[str, Any] = {
        "always_fast": mix_figures(ids, rows, dict.fromkeys(ids, "fast"), sources, boot),
        "random_mix": random_mix(ids, rows, share, boot),
        "group_lookup": None,  # learnt from dev tasks: only on the test side out of its sample
    }
    train = _examples(split_tasks("dev"), stored)
    if side == "test" and train:
        lookup = lookup_tiers(train, _examples(have, stored), shipped_margin(stored.regime), share)
        out["group_lookup"] = mix_figures(ids, rows, lookup, sources, boot)
    return out


def seconds_note(files: Sequence[Stored]) -> str:
    """Why the stored ``seconds`` say nothing about either tier's speed per answer."""
    reused = [f"{s.path.name} took the full tier's answers from {s.full_from}" for s in files if s.full_from]  # fmt: skip
    return ("stored seconds are not comparable across tiers: the collector asks both tiers "
            "for a task at once, several tasks in flight, on a shared machine"
            + ("; " + "; ".join(reused) if reused else "")
            + " (bench.tiers measures time per answer)")  # fmt: skip


def _fmt(fig: Mapping[str, Any] | None) -> str:
    if fig is None:
        return "-"
    ci = fig.get("quality_vs_full_ci") or ["?", "?"]
    return (f"q {fig['quality_vs_full']} [{ci[0]}, {ci[1]}] share {fig['fast_share']} "
            f"tokens {fig['token_ratio']}")  # fmt: skip


def show(regime: str, fig: Mapping[str, Any], log: Callable[[str], None]) -> None:
    log(f"{regime}: {fig['tasks']} tasks ({fig['missing']} without stored outcomes), "
        f"{fig['by_rule']} decided by a rule, thresholds {fig['thresholds']}")  # fmt: skip
    log(f"  routed: {_fmt(fig)}; fast tier alone writes {fig['fast_token_ratio']}x, "
        f"{fig['fast_token_ratio_routed']}x on the steps routed to it")  # fmt: skip
    for name, base in fig["baselines"].items():
        log(f"  {name}: {_fmt(base)}")
    for fam, f in fig["per_family"].items():
        log(f"  {fam:32} {f['tasks']:4d} {_fmt(f)} fast alone {f['fast_token_ratio']}")


def replay(args: argparse.Namespace, tasks: Sequence[Task], log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """The last line of ``bench.routed_mix --outcomes-from FILE...`` without ``--thresholds``."""
    files = [read(p) for p in args.outcomes_from]
    regimes = [s.regime for s in files]
    if len(set(regimes)) < len(regimes):
        raise SystemExit(f"--outcomes-from: one file per regime, got {regimes}")
    result = {s.regime: replay_regime(s, tasks, args.side, args.boot) for s in files}
    for regime, fig in result.items():
        show(regime, fig, log)
    note = seconds_note(files)
    log(f"note: {note}")
    head = result.get("greedy") or result[regimes[0]]
    always_fast = head["baselines"]["always_fast"]
    return dict.fromkeys(MEASURED) | {
        "mode": "replay",
        "quality_vs_full": head["quality_vs_full"],
        "quality_vs_full_ci_low": (head["quality_vs_full_ci"] or [None])[0],
        "fast_share": head["fast_share"],
        "token_ratio": head["token_ratio"],
        "fast_token_ratio": head["fast_token_ratio"],
        "fast_token_ratio_routed": head["fast_token_ratio_routed"],
        "baseline_fast": {
            "quality_vs_full": always_fast["quality_vs_full"],
            "quality_vs_full_ci_low": (always_fast["quality_vs_full_ci"] or [None])[0],
            "token_ratio": always_fast["token_ratio"],
        },
        "headline_regime": "greedy" if "greedy" in result else regimes[0],
        "side": args.side,
        "tasks": head["tasks"],
        "threshold": None,  # the models' own
        "split_sha256": load_split().sha256,
        "seconds_comparable": False,
        "seconds_note": note,
        "regimes": result,
    }


def threshold_sweep(args: argparse.Namespace, tasks: Sequence[Task], log: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """The threshold sweep from one file's outcomes of the two tiers (no stack, no CPU figures)."""
    (path,) = args.outcomes_from
    stored = read(path)
    have = [t for t in tasks if t.key in stored.rows]
    full = {t.id: float(stored.rows[t.key]["full"]["score"]) for t in have}
    fast = {t.id: float(stored.rows[t.key]["fast"]["score"]) for t in have}
    log(f"{len(have)} of {len(tasks)} {args.side} tasks have stored outcomes in {path}")
    values = [float(v) for v in args.thresholds.split(",")]
    bodies = {t.id: stored.request(t) for t in have}
    table = sweep(decisions(bodies), full, fast, {t.id: t.source for t in have}, values, args.boot)  # fmt: skip
    return dict.fromkeys((*MEASURED, "quality_vs_full", "quality_vs_full_ci_low", "fast_share")) | {
        "mode": "sweep",
        "side": args.side,
        "tasks": len(have),
        "outcomes_from": str(path),
        "split_sha256": load_split().sha256,
        "sweep": table,
        "operating_point": operating_point(table, args.keep),
    }
