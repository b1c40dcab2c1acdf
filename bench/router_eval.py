"""Router quality on families it never saw: the trained classifiers against named baselines.

    python -m bench.router_eval [--outcomes bench/data/router_outcomes.jsonl]
        [--sampled-outcomes bench/data/router_outcomes_sampled.jsonl]
        [--write-model router/assets/classifier.json]
        [--write-sampled-model router/assets/classifier-sampled.json]
        [--write-examples FILE] [--plot docs/img/router_eval.png] [--plot-mix FILE]
        [--check FILE ...] [--repeat FILE ...] [--bootstrap 1000] [--margin M] [--quick]

1. Builds the labelled sets (and prints each group's mean score on both tiers): the
   checkable tasks of ``bench.router_tasks`` (BFCL, HumanEval, reasoning-gym, exact-answer
   questions) joined with the checked answers of both embedded tiers from
   ``bench.router_outcomes``, for two serving regimes: greedy (one answer at temperature 0)
   and sampled (the mean of four answers at temperature 0.7). Label: 1 when the full tier
   scored more than the margin above the fast tier. The tasks are divided by the locked
   split ``bench/data/router_split.json`` (``bench.router_split``: 13 families, exact
   duplicates on one side): everything below is trained and tuned on **dev** tasks only
   and reported on **test** tasks.
2. Tuning, per regime, on the dev split: the L2 strength by 5-fold AUC, then the label
   margin (0, 0.25, 0.5) by leave-one-family-out APGR among the dev tasks (``--margin``
   fixes it); the model's threshold by the quality target on its training scores.
3. **Headline: leave one family out** (``bench.router_lofo``): for each family, a model
   trained on the dev tasks of the other twelve, scored on the held-out family's test tasks;
   AUC and APGR per family, averaged over families, and pooled, with 95% bootstrap
   intervals; beside it always-full, always-fast, the length threshold, the rules alone,
   the group lookup (a named baseline: the training positive rate of the task's group,
   from the coarsest level seen), and the classifier behind each rule of the chain.
4. **Secondary: in distribution**: one model trained on all dev tasks (the shipped one with
   ``--write-model``), on the test split, with the same routers and intervals.
5. MT-Bench's fast-tier share per category (no checker: not in the figures); ``--check`` /
   ``--repeat`` (``bench.router_checks``).

The training data are single-turn requests: neither ``bench/data`` nor the store hold
multi-step tool-loop steps with both tiers' checked outcomes, so conversation depth, user
turns and tool-loop depth are constant in training (``multi_step_examples`` in the output).

Last line: one JSON object with ``auc_heldout_family``, ``apgr_heldout_family``,
``apgr_best_baseline_heldout_family`` (greedy regime, macro over families), their
intervals, the pooled figures, the in-distribution ones (``*_test_split``), every
router's figures, and the same for the sampled regime under ``sampled``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.router_checks import Shipped, check
from bench.router_lofo import (
    Evaluation,
    Held,
    base_rates,
    choose_margin,
    evaluate,
    families,
    leave_one_family_out,
    router_scores,
    trainer,
)  # fmt: skip
from bench.router_outcomes import DEFAULT_OUT, SAMPLED_OUT, header, load
from bench.router_plots import fine_group, plot, plot_mix
from bench.router_split import Split, problems
from bench.router_split import load as load_split
from bench.router_tasks import Task, all_tasks
from router.classifier import Classifier, write_model
from router.dataset import write_examples
from router.report import CHAINS
from router.training import DEFAULT_MARGIN, Example, fit

QUICK_L2 = (0.003,)  # --quick: the shipped models' choice, no search


def _shown(path: Path) -> str:
    """A path as the model file records it: relative to the repo when inside it."""
    root = Path(__file__).resolve().parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def _group(task: Task) -> str:
    return f"{task.source}/{task.category}"


GREEDY_COMMAND = "python -m bench.router_outcomes"
SAMPLED_COMMAND = f"python -m bench.router_outcomes --samples 4 --out {_shown(SAMPLED_OUT)}"


def examples_from(
    tasks: list[Task], outcomes: dict[str, dict[str, Any]], command: str = GREEDY_COMMAND
) -> list[Example]:
    missing = [t.id for t in tasks if t.check is not None and t.key not in outcomes]
    if missing:
        raise SystemExit(
            f"{len(missing)} tasks have no cached outcome (first: {missing[0]}); run "
            f"`{command}` to collect them (it resumes where it stopped)"
        )
    return [
        Example(t.id, t.body, outcomes[t.key]["full"]["score"], outcomes[t.key]["fast"]["score"], _group(t))
        for t in tasks
        if t.check is not None
    ]  # fmt: skip


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
    full = statistics.fmean(e.full for e in examples)
    fast = statistics.fmean(e.fast for e in examples)
    share = statistics.fmean(e.label(margin) for e in examples)
    print(f"{'all (fast / full ' + format(fast / full, '.2f') + ')':34} {len(examples):5d} "
          f"{full:5.2f} {fast:5.2f} {share:10.0%}", file=sys.stderr)  # fmt: skip


MARGINS = (0.0, 0.25, 0.5)
BOOTSTRAP = 1000


@dataclass
class Regime:
    """One serving regime: its examples on both sides of the locked split, the tuning done
    on the dev side, and both evaluations."""

    name: str
    source: Path
    examples: list[Example]
    split: Split
    tuning: dict[str, Any] = field(default_factory=dict)
    model: Classifier | None = None  # trained on every dev task: the shipped one
    spec: dict[str, Any] = field(default_factory=dict)
    lofo: Evaluation | None = None
    rates: dict[str, Any] = field(default_factory=dict)
    in_dist: Evaluation | None = None
    in_held: list[Held] = field(default_factory=list)

    @property
    def dev(self) -> list[Example]:
        return [e for e in self.examples if e.id in self.split.dev]

    @property
    def test(self) -> list[Example]:
        return [e for e in self.examples if e.id in self.split.test]

    @property
    def margin(self) -> float:
        return float(self.tuning["margin"])

    def run(self, args: argparse.Namespace) -> None:
        dev, test = self.dev, self.test
        meta = {"outcomes": _shown(self.source), "regime": self.name, "trained_on": "dev split",
                "split_sha256": self.split.sha256}  # fmt: skip
        if "fast_tier" in header(self.source):
            meta["fast_tier"] = header(self.source)["fast_tier"]
        fixed = args.margin if args.margin is not None else DEFAULT_MARGIN
        if args.quick:
            self.tuning = {"l2": QUICK_L2[0], "margin": fixed, "quick": True}
        else:
            l2 = fit(dev, margin=fixed)["training"]["l2"]
            print(f"{self.name}: L2 {l2} by 5-fold AUC on dev", file=sys.stderr)
            chosen = {"margin": args.margin} if args.margin is not None else choose_margin(dev, MARGINS, l2)  # fmt: skip
            self.tuning = {"l2": l2, **chosen}
        margin, l2 = self.margin, float(self.tuning["l2"])
        self.spec = fit(dev, margin=margin, l2_grid=(l2,), meta={**meta, "tuning": self.tuning})
        self.model = Classifier(self.spec)
        boot = args.bootstrap if not args.quick else 50
        held = leave_one_family_out(dev, test, trainer(margin, l2, meta=meta), margin)
        self.lofo = evaluate(held, margin, boot)
        self.rates = base_rates(held, margin)
        self.in_held = [
            Held(fam, part, router_scores(self.model, dev, part, margin), self.model)
            for fam in families(test)
            for part in [[e for e in test if e.group == fam]]
        ]
        self.in_dist = evaluate(self.in_held, margin, boot)

    def at_threshold(self) -> dict[str, float]:
        assert self.model is not None
        test = self.test
        to_full = [self.model.predict(e.body).probability >= self.model.threshold for e in test]
        n = len(test)
        quality = sum(e.full if f else e.fast for e, f in zip(test, to_full, strict=True)) / n
        full, fast = (statistics.fmean(getattr(e, k) for e in test) for k in ("full", "fast"))
        return {"threshold": self.model.threshold, "full_share": round(sum(to_full) / n, 4),
                "quality": round(quality, 4), "pgr": round((quality - fast) / (full - fast), 4)}  # fmt: skip

    def tiers(self) -> dict[str, Any]:
        test = self.test
        return {"full": round(statistics.fmean(e.full for e in test), 4),
                "fast": round(statistics.fmean(e.fast for e in test), 4), "examples": len(test),
                "positives": sum(e.label(self.margin) for e in test)}  # fmt: skip

    def print(self) -> None:
        assert self.lofo is not None and self.in_dist is not None
        print(f"\n{self.name} serving: tuned on dev {self.tuning.get('l2')} L2, margin "
              f"{self.margin}; test split {self.tiers()}", file=sys.stderr)  # fmt: skip
        head = (
            f"{'router':32} {'AUC':>6} {'95% CI':>13} {'APGR':>6} {'95% CI':>13}  pooled AUC  APGR"
        )
        for title, ev in (("held-out family (leave one out; mean over families)", self.lofo),
                          ("in distribution (trained on dev; mean over families)", self.in_dist)):  # fmt: skip
            print(f"\n{title}:\n{head}", file=sys.stderr)
            for name, r in ev.routers.items():
                print(f"{name:32} {_f(r['auc'])} {_ci(r['auc_ci'])} {_f(r['apgr'])} {_ci(r['apgr_ci'])}"
                      f"  {_f(r['auc_pooled']):>10} {_f(r['apgr_pooled'])}", file=sys.stderr)  # fmt: skip
            b = ev.best_baseline["apgr"]
            print(f"best baseline on APGR: {b['name']} {_f(b['value'])}; classifier minus it "
                  f"{_f(b['classifier_minus_best'])} {_ci(b['classifier_minus_best_ci'])}", file=sys.stderr)  # fmt: skip
        print("\nper held-out family (AUC / APGR): classifier | group lookup | length threshold"
              " | needs full, mean score, sent to full", file=sys.stderr)  # fmt: skip
        for fam, rows in self.lofo.per_set.items():
            cells = " | ".join(f"{_f(rows[n]['auc'])} / {_f(rows[n]['apgr'])}"
                               for n in ("classifier", "group_lookup", "length_threshold"))  # fmt: skip
            r = self.rates["families"][fam]
            print(f"  {fam:32} {cells} | {r['needs_full']:4.0%} {r['mean_score']:5.2f} {r['to_full']:4.0%}", file=sys.stderr)  # fmt: skip
        print(f"rank correlation over held-out families of 'needs full' and the mean score: "
              f"{self.rates['spearman_needs_full_vs_score']:.2f}", file=sys.stderr)  # fmt: skip
        at = self.at_threshold()
        print(f"at the dev-chosen threshold {at['threshold']:.3f}: {at['full_share']:.0%} of test "
              f"steps on full, PGR {at['pgr']:.2f}", file=sys.stderr)  # fmt: skip

    def summary(self) -> dict[str, Any]:
        assert self.lofo is not None and self.in_dist is not None
        lofo, ind = self.lofo.routers, self.in_dist.routers
        best, best_in = self.lofo.best_baseline["apgr"], self.in_dist.best_baseline["apgr"]
        cls = lofo["classifier"]
        rules = {
            name: {"apgr_heldout_family": lofo[name]["apgr"], "auc_heldout_family": lofo[name]["auc"],
                   "apgr_minus_classifier": _d(lofo[name]["apgr"], cls["apgr"]),
                   "apgr_pooled_minus_classifier": _d(lofo[name]["apgr_pooled"], cls["apgr_pooled"])}
            for name in CHAINS
        }  # fmt: skip
        return {
            "auc_heldout_family": cls["auc"],
            "auc_heldout_family_ci": cls["auc_ci"],
            "apgr_heldout_family": cls["apgr"],
            "apgr_heldout_family_ci": cls["apgr_ci"],
            "apgr_best_baseline_heldout_family": best["value"],
            "best_baseline_heldout_family": best["name"],
            "apgr_minus_best_baseline_heldout_family_ci": best["classifier_minus_best_ci"],
            "auc_heldout_family_pooled": cls["auc_pooled"],
            "apgr_heldout_family_pooled": cls["apgr_pooled"],
            "apgr_best_baseline_heldout_family_pooled": self.lofo.best_baseline["apgr_pooled"]["value"],
            "best_baseline_heldout_family_pooled": self.lofo.best_baseline["apgr_pooled"]["name"],
            "auc_test_split": ind["classifier"]["auc_pooled"],
            "apgr_test_split": ind["classifier"]["apgr_pooled"],
            "apgr_best_baseline_test_split": self.in_dist.best_baseline["apgr_pooled"]["value"],
            "best_baseline_test_split": self.in_dist.best_baseline["apgr_pooled"]["name"],
            "auc_test_split_within_families": ind["classifier"]["auc"],
            "apgr_test_split_within_families": ind["classifier"]["apgr"],
            "apgr_best_baseline_test_split_within_families": best_in["value"],
            "routers_heldout_family": lofo,
            "routers_test_split": ind,
            "per_family_heldout": self.lofo.per_set,
            "family_base_rates_heldout": self.rates,
            "rules_heldout_family": rules,
            "tuning": self.tuning,
            "test_split": self.tiers(),
            "at_threshold": self.at_threshold(),
        }  # fmt: skip


def _f(v: float | None) -> str:
    return "   n/a" if v is None else f"{v:6.3f}"


def _ci(ci: list[float] | None) -> str:
    return f"{'':>13}" if ci is None else f"[{ci[0]:.3f},{ci[1]:.3f}]"


def _d(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 4)


def multi_step_examples(examples: list[Example]) -> int:
    """Labelled examples that are a later step of a tool loop (a tool message, or more than
    one user turn): none in the shipped outcomes."""

    def later(body: Any) -> bool:
        messages = body.get("messages") or []
        roles = [m.get("role") for m in messages if isinstance(m, dict)]
        return "tool" in roles or roles.count("user") > 1

    return sum(1 for e in examples if later(e.body))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--outcomes", type=Path, default=DEFAULT_OUT, help="greedy outcomes")
    parser.add_argument(
        "--sampled-outcomes", type=Path, default=SAMPLED_OUT,
        help="outcomes sampled at T=0.7 (bench.router_outcomes --samples 4)",
    )  # fmt: skip
    parser.add_argument("--write-model", type=Path, help="save the greedy dev-split model here")
    parser.add_argument(
        "--write-sampled-model", type=Path, help="save the sampled dev-split model here"
    )
    parser.add_argument("--write-examples", type=Path, help="save the greedy labelled set")
    parser.add_argument(
        "--check", type=Path, action="append", default=[],
        help="more outcomes (e.g. --samples 4 --temperature 0.3 --scale 0.25): both models on "
        "their test-split tasks; repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=Path, action="append", default=[],
        help="a second collection of a shipped regime (same samples, temperature and fast "
        "tier; e.g. --scale 0.25): --check, and how well the labels repeat; repeatable",
    )  # fmt: skip
    parser.add_argument("--plot", type=Path, help="PGR curves on the test split (PNG)")
    parser.add_argument("--plot-mix", type=Path, help="routing mix by task group (PNG)")
    parser.add_argument("--bootstrap", type=int, default=BOOTSTRAP, help="bootstrap resamples")
    parser.add_argument(
        "--margin", type=float, default=None,
        help=f"label margin for both regimes instead of choosing one of {MARGINS} on dev tasks",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help=f"no tuning (margin {DEFAULT_MARGIN}, L2 {QUICK_L2[0]}), 50 resamples: a smoke run",
    )  # fmt: skip
    args = parser.parse_args()

    tasks = all_tasks()
    locked = load_split()
    if found := problems(locked, tasks):
        raise SystemExit(f"the locked split does not match the tasks ({found[0]}; "
                         f"{len(found)} in all): see python -m bench.router_split")  # fmt: skip
    greedy = Regime("greedy", args.outcomes, examples_from(tasks, load(args.outcomes)), locked)
    sampled = Regime("sampled", args.sampled_outcomes,
                     examples_from(tasks, load(args.sampled_outcomes), SAMPLED_COMMAND), locked)  # fmt: skip
    if args.write_examples:
        write_examples(args.write_examples, greedy.examples)
    groups = Counter(e.group for e in greedy.examples)
    print(f"{len(greedy.examples)} checkable tasks in {len(groups)} families; split "
          f"{locked.sha256[:12]}: {len(locked.dev)} dev, {len(locked.test)} test", file=sys.stderr)  # fmt: skip
    for regime in (greedy, sampled):
        print(f"\n{regime.name} outcomes:", file=sys.stderr)
        print_groups(regime.examples, DEFAULT_MARGIN)
        regime.run(args)
        regime.print()

    shipped = [Shipped(r.name, r.source, r.examples, r.model) for r in (greedy, sampled) if r.model]
    checks = {
        _shown(path): check(path, tasks, shipped, locked.test, greedy.margin, examples_from,
                            repeat=path in args.repeat)
        for path in [*args.check, *args.repeat]
    }  # fmt: skip
    for name, c in checks.items():
        print(f"\n{name}: {c['tasks']} test-split tasks, {c['positives']} labelled 'needs full'", file=sys.stderr)  # fmt: skip
        for model in ("greedy_model", "sampled_model"):
            print(f"  {model:14} AUC {c[model]['auc']:.3f}  APGR {c[model]['apgr']:.3f}", file=sys.stderr)  # fmt: skip
        if "repeat" in c:
            r = c["repeat"]
            print(f"  collected again: {r['tasks']} tasks, labels alike on {r['label_agreement']:.1%}, "
                  f"AUC of the shipped labels as a router {r['auc_known_labels']}", file=sys.stderr)  # fmt: skip

    assert greedy.model is not None and sampled.model is not None
    mtbench = {r.name: mtbench_mix(m, tasks) for r, m in ((greedy, greedy.model), (sampled, sampled.model))}  # fmt: skip
    print(f"\nMT-Bench fast-tier share by category: {mtbench}", file=sys.stderr)

    for path, regime in ((args.write_model, greedy), (args.write_sampled_model, sampled)):
        if path:
            write_model(regime.spec, path)
    if args.plot:
        report = {k: {"apgr": v["apgr_pooled"]} for k, v in greedy.in_dist.routers.items()}  # type: ignore[union-attr]
        plot(args.plot, greedy.model, greedy.test, report)
    if args.plot_mix:
        plot_mix(args.plot_mix, greedy.model, greedy.test, tasks)

    summary = {
        **greedy.summary(),
        "split_sha256": locked.sha256,
        "multi_step_examples": multi_step_examples(greedy.examples),
        "mtbench_fast_share": mtbench,
        "sampled": sampled.summary(),
        "checks": checks,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
