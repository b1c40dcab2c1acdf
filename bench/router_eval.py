"""Router quality: the trained classifier against the baselines, on real outcomes of both tiers.

    python -m bench.router_eval [--outcomes bench/data/router_outcomes.jsonl]
                                [--write-model router/assets/classifier.json]
                                [--write-examples FILE] [--plot docs/img/router_eval.png]

1. Builds the labelled set (and prints each group's mean score on both tiers): the checkable tasks of ``bench.router_tasks`` (BFCL, HumanEval,
   reasoning-gym at three difficulties) joined with the checked answers of both embedded
   tiers from ``bench.router_outcomes`` (collect them first; about 40 minutes on two
   cores). Label: 1 when the full tier scored more than 0.25 above the fast tier.
2. Splits it (70/30, stratified by source and category, seed 0), trains the classifier on
   the 70% (``router.training``) and reports on the held-out 30%, for the classifier and
   every baseline (always full, always fast, random, length threshold, rules): AUC against
   the held-out labels, and APGR and CPT(50%)/CPT(80%) as RouteLLM defines them over the
   real outcomes. The same figures averaged over five more splits show how much of the
   difference is the split.
3. Reports the classifier's fast-tier share on MT-Bench's categories (no checker exists
   for those answers, so they are not in the figures above).

``--write-model`` saves the model trained on the seed-0 training split (the one whose
held-out figures are printed): that is the file the repo ships. Last line: one JSON object
with ``auc``, ``apgr``, ``apgr_best_baseline``, ``cpt50``, ``cpt80``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.router_outcomes import DEFAULT_OUT, load
from bench.router_tasks import Task, all_tasks
from router.classifier import Classifier
from router.dataset import write_examples
from router.evaluation import auc, routing_curve
from router.report import BASELINES, CHAINS, best_baseline, compare
from router.training import DEFAULT_MARGIN, Example, fit, split

REPEATS = 5


def _group(task: Task) -> str:
    return f"{task.source}/{task.category}"


def examples_from(tasks: list[Task], outcomes: dict[str, dict[str, Any]]) -> list[Example]:
    missing = [t.id for t in tasks if t.check is not None and t.key not in outcomes]
    if missing:
        raise SystemExit(
            f"{len(missing)} tasks have no cached outcome (first: {missing[0]}); run "
            "`python -m bench.router_outcomes` to collect them (it resumes where it stopped)"
        )
    return [
        Example(t.id, t.body, outcomes[t.key]["full"]["score"], outcomes[t.key]["fast"]["score"], _group(t))
        for t in tasks
        if t.check is not None
    ]  # fmt: skip


def fine_group(ex: Example) -> str:
    """Source, category and difficulty: what a router cannot see but the labels follow."""
    parts = ex.id.split("/")
    return "/".join(parts[:3]) if parts[0] == "rg" else ex.group


def mtbench_mix(model: Classifier, tasks: list[Task]) -> dict[str, float]:
    """The share of MT-Bench's first turns the model leaves on the fast tier, per category."""
    mix: dict[str, list[float]] = defaultdict(list)
    for t in tasks:
        if t.source == "mtbench":
            mix[t.category].append(float(model.predict(t.body).probability < model.threshold))
    return {k: round(statistics.fmean(v), 2) for k, v in sorted(mix.items())}


def print_groups(examples: list[Example], margin: float) -> None:
    """Each group's mean checked score on both tiers and its share labelled 'needs full'."""
    by_group: dict[str, list[Example]] = defaultdict(list)
    for e in examples:
        by_group[fine_group(e)].append(e)
    print(f"{'group':34} {'tasks':>5} {'full':>5} {'fast':>5} {'needs full':>10}", file=sys.stderr)
    for name, members in sorted(by_group.items()):
        full = statistics.fmean(e.full for e in members)
        fast = statistics.fmean(e.fast for e in members)
        share = statistics.fmean(e.label(margin) for e in members)
        print(f"{name:34} {len(members):5d} {full:5.2f} {fast:5.2f} {share:10.0%}", file=sys.stderr)


def group_ceiling(train: list[Example], test: list[Example], margin: float) -> dict[str, float]:
    """AUC of scoring each held-out task by its group's positive rate: from the training
    split (a router that knew every task's group) and from the held-out split itself (an
    oracle): how much of the label is group-level, and how much is per-task noise."""
    labels = [e.label(margin) for e in test]

    def rates(examples: list[Example]) -> dict[str, float]:
        by: dict[str, list[int]] = defaultdict(list)
        for e in examples:
            by[fine_group(e)].append(e.label(margin))
        return {k: statistics.fmean(v) for k, v in by.items()}

    prior, oracle = rates(train), rates(test)
    return {
        "auc_group_prior": round(auc([prior.get(fine_group(e), 0.0) for e in test], labels), 4),
        "auc_group_oracle": round(auc([oracle[fine_group(e)] for e in test], labels), 4),
    }


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--outcomes", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--write-model", type=Path, help="save the seed-0 model here")
    parser.add_argument("--write-examples", type=Path, help="save the labelled set (JSONL)")
    parser.add_argument("--plot", type=Path, help="PGR curves of every router (PNG)")
    parser.add_argument("--plot-mix", type=Path, help="routing mix by task group (PNG)")
    parser.add_argument(
        "--margin", type=float, default=DEFAULT_MARGIN,
        help="label 1 when the full score exceeds the fast score by more than this",
    )  # fmt: skip
    args = parser.parse_args()

    tasks = all_tasks()
    examples = examples_from(tasks, load(args.outcomes))
    if args.write_examples:
        write_examples(args.write_examples, examples)
    groups = Counter(e.group for e in examples)
    print(f"{len(examples)} checkable tasks in {len(groups)} groups", file=sys.stderr)
    print_groups(examples, args.margin)

    runs = []
    for seed in range(REPEATS + 1):
        train, test = split(examples, 0.3, seed)
        meta = {"split_seed": seed, "outcomes": str(args.outcomes)}
        spec = fit(train, seed=seed, margin=args.margin, meta=meta)
        model = Classifier(spec)
        report = compare(model, test, margin=args.margin)
        report["ceiling"] = group_ceiling(train, test, args.margin)
        runs.append(report)
        if seed == 0:
            first_model, first_test, first_spec = model, test, spec
    report = runs[0]
    repeated = {
        name: {
            key: round(statistics.fmean(r[name][key] for r in runs[1:]), 4)
            for key in ("auc", "apgr")
        }
        for name in ("classifier", *CHAINS, *BASELINES, "random")
    }

    print(f"\nheld-out split (seed 0): {report['tiers']}", file=sys.stderr)
    print(f"{'router':24} {'AUC':>6} {'APGR':>6} {'CPT50':>6} {'CPT80':>6}   mean of {REPEATS} more splits: AUC  APGR", file=sys.stderr)  # fmt: skip
    for name in ("classifier", *CHAINS, *BASELINES, "random"):
        r, m = report[name], repeated[name]
        print(f"{name:24} {r['auc']:6.3f} {r['apgr']:6.3f} {r['cpt50']:6.3f} {r['cpt80']:6.3f}"
              f"   {m['auc']:>30.3f} {m['apgr']:.3f}", file=sys.stderr)  # fmt: skip
    ceiling = {
        k: round(statistics.fmean(r["ceiling"][k] for r in runs), 4) for k in runs[0]["ceiling"]
    }
    print(f"AUC if each task's group (source/category/difficulty) were known, mean of all "
          f"splits: rate from training {ceiling['auc_group_prior']:.3f}, "
          f"oracle rate from the held-out split {ceiling['auc_group_oracle']:.3f}", file=sys.stderr)  # fmt: skip
    at = report["at_threshold"]
    print(f"at the shipped threshold {at['threshold']:.3f}: {at['full_share']:.0%} of steps on "
          f"full, PGR {at['pgr']:.2f}", file=sys.stderr)  # fmt: skip

    mtbench = mtbench_mix(first_model, tasks)
    print(f"MT-Bench fast-tier share by category: {mtbench}", file=sys.stderr)

    if args.write_model:
        args.write_model.parent.mkdir(parents=True, exist_ok=True)
        args.write_model.write_text(json.dumps(first_spec, indent=1, sort_keys=True) + "\n")
    if args.plot:
        plot(args.plot, first_model, first_test, report)
    if args.plot_mix:
        plot_mix(args.plot_mix, first_model, first_test, tasks)

    base, base_apgr = best_baseline(report)
    summary = {
        "auc": report["classifier"]["auc"],
        "apgr": report["classifier"]["apgr"],
        "apgr_best_baseline": base_apgr,
        "best_baseline": base,
        "cpt50": report["classifier"]["cpt50"],
        "cpt80": report["classifier"]["cpt80"],
        "auc_mean_splits": repeated["classifier"]["auc"],
        "apgr_mean_splits": repeated["classifier"]["apgr"],
        "apgr_best_baseline_mean_splits": max(repeated[k]["apgr"] for k in (*BASELINES, "random")),
        "held_out": report["tiers"],
        "ceiling_mean_splits": ceiling,
        "at_threshold": at,
        "mtbench_fast_share": mtbench,
        "baselines": {k: report[k] for k in (*BASELINES, "random")},
        "chains": {k: {**report[k], "mean_splits": repeated[k]} for k in CHAINS},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
