"""``bench.router_eval --check / --repeat``: the shipped-regime models on other outcome files.

``--check FILE``: both regimes' models (trained on the dev split) on the locked test tasks a
file of other outcomes covers — answers sampled at another temperature for a subset of the
tasks (``bench.router_outcomes --samples 4 --temperature 0.3 --scale 0.25``), or another fast
tier's. ``--repeat FILE``: the same for a second collection of a shipped regime (same
samples, temperature and fast tier), and how well that regime's labels repeat.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.router_outcomes import header, load
from bench.router_tasks import Task
from router.classifier import Classifier
from router.evaluation import auc
from router.report import metrics
from router.training import Example

Examples = Callable[[list[Task], dict[str, dict[str, Any]]], list[Example]]


@dataclass
class Shipped:
    """A regime as the checks need it: its name, outcomes file, examples and dev-split model."""

    name: str
    source: Path
    examples: list[Example]
    model: Classifier


def tier_sums(covered: list[Example], base: list[Example]) -> dict[str, dict[str, float]]:
    """Per source, the summed scores of both tiers in another outcome file and of the fast
    tier of ``base`` (the shipped outcomes of the same regime) on the same tasks: how another
    fast tier compares, task by task."""
    fast_before = {e.id: e.fast for e in base}
    sums: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(
        ("tasks", "full", "fast", "fast_outcomes"), 0.0))  # fmt: skip
    for e in covered:
        for name in (e.id.split("/")[0], "all"):
            row = sums[name]
            row["tasks"] += 1
            row["full"] += e.full
            row["fast"] += e.fast
            row["fast_outcomes"] += fast_before[e.id]
    return {k: {f: round(v, 2) for f, v in row.items()} for k, row in sorted(sums.items())}


def repeatability(covered: list[Example], base: list[Example], margin: float) -> dict[str, Any]:
    """How well the labels of ``base`` (the shipped outcomes) repeat in ``covered`` (the same
    tasks collected again in the same regime: another run, day or machine): the share of
    tasks labelled alike, and the AUC against the new labels of a router that scored every
    task by its label in ``base``: what the labels' noise alone costs a router that learned
    them perfectly."""
    before = {e.id: e.label(margin) for e in base}
    first = [before[e.id] for e in covered]
    again = [e.label(margin) for e in covered]
    alike = sum(a == b for a, b in zip(first, again, strict=True))
    out: dict[str, Any] = {
        "tasks": len(covered),
        "label_agreement": round(alike / max(len(covered), 1), 4),
        "positives": [sum(first), sum(again)],
    }
    try:
        out["auc_known_labels"] = round(auc([float(a) for a in first], again), 4)
    except ValueError:  # one class only among these tasks
        out["auc_known_labels"] = None
    return out


def how(path: Path) -> tuple[Any, Any]:
    """How a file's answers were sampled: (answers per task, temperature)."""
    h = header(path)
    samples = h.get("samples", 1)
    return samples, (0.0 if samples == 1 else h.get("temperature"))


def check(
    path: Path,
    tasks: list[Task],
    regimes: Sequence[Shipped],
    test_ids: Collection[str],
    margin: float,
    examples_from: Examples,
    repeat: bool = False,
) -> dict[str, Any]:
    """Both regimes' models on other outcomes, on the test-split tasks they cover."""
    greedy, sampled = regimes
    rows = load(path)
    covered = examples_from([t for t in tasks if t.key in rows], rows)
    examples = [e for e in covered if e.id in test_ids]
    # the shipped fast tier's scores from the regime the file was collected in (sampled rows
    # keep each answer's score; older files have no "samples" in their header)
    was_sampled = any(len(r["fast"].get("scores", ())) > 1 for r in rows.values())
    same = sampled if was_sampled else greedy
    out: dict[str, Any] = {"tasks": len(examples),
                           "positives": sum(e.label(margin) for e in examples),
                           "tiers": tier_sums(covered, same.examples)}  # fmt: skip
    if repeat:
        if how(path) != how(same.source):
            raise SystemExit(
                f"--repeat {path}: collected with (samples, temperature) {how(path)}, the "
                f"shipped {same.name} outcomes with {how(same.source)}; "
                "use --check for outcomes of another regime"
            )
        out["repeat"] = repeatability(covered, same.examples, margin)
    for regime in regimes:
        scores = [regime.model.predict(e.body).probability for e in examples]
        try:
            out[f"{regime.name}_model"] = metrics(scores, examples, margin)
        except ValueError as exc:  # too few tasks: no positives, or no quality gap
            raise SystemExit(f"--check {path}: {exc}") from None
    return out
