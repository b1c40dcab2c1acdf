"""Plots for ``bench.router_eval``: PGR curves of every router, and the routing mix."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.router_tasks import Task
from router.classifier import Classifier
from router.evaluation import routing_curve
from router.report import BASELINES
from router.training import Example


def fine_group(ex: Example) -> str:
    """Source, category and difficulty: what a router cannot see but the labels follow."""
    parts = ex.id.split("/")
    return "/".join(parts[:3]) if parts[0] == "rg" else ex.group


def plot(path: Path, model: Classifier, test: list[Example], report: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strong = [e.full for e in test]
    weak = [e.fast for e in test]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    routers = {"classifier": [model.predict(e.body).probability for e in test]}
    routers.update({k: [f(e) for e in test] for k, f in BASELINES.items() if k != "always_fast"})
    for name, scores in routers.items():
        curve = routing_curve(scores, strong, weak)
        label = f"{name} (APGR {report[name]['apgr']:.2f})"
        style = "-" if name == "classifier" else "--"
        ax.plot(
            curve.cost, curve.pgr, style, label=label, linewidth=2 if name == "classifier" else 1
        )
    ax.plot([0, 1], [0, 1], ":", color="grey", label="random (APGR 0.50)")
    ax.set_xlabel("share of steps sent to the full tier")
    ax.set_ylabel("performance gap recovered (PGR)")
    ax.set_title(f"Router on {len(test)} held-out tasks (real outcomes of both tiers)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def plot_mix(path: Path, model: Classifier, test: list[Example], tasks: list[Task]) -> None:
    """Where the shipped model sends each kind of step: the share routed to the full tier
    at its threshold, next to the share where the full tier actually did better."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for e in test:
        group = fine_group(e).replace("reasoning_gym/", "rg/").replace("rg/", "rg ")
        rows[group][0].append(float(model.predict(e.body).probability >= model.threshold))
        rows[group][1].append(float(e.label()))
    for t in tasks:
        if t.source == "mtbench":
            p = model.predict(t.body).probability
            rows[f"MT-Bench {t.category}"][0].append(float(p >= model.threshold))
    names = sorted(rows, key=lambda k: (k.startswith("MT-Bench"), k))
    routed = [statistics.fmean(rows[k][0]) for k in names]
    needed = [statistics.fmean(rows[k][1]) if rows[k][1] else float("nan") for k in names]
    fig, ax = plt.subplots(figsize=(7, 0.26 * len(names) + 1.2))
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], routed, height=0.4, label="routed to full (shipped threshold)")
    ax.barh([i - 0.2 for i in y], needed, height=0.4, label="full tier did better (label)")
    ax.set_yticks(list(y), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of steps")
    ax.set_title("Routing mix on held-out tasks and MT-Bench (no labels)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
