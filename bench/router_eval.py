"""Router quality: the trained classifiers against the baselines, on real outcomes of both tiers.

    python -m bench.router_eval [--outcomes bench/data/router_outcomes.jsonl]
        [--sampled-outcomes bench/data/router_outcomes_sampled.jsonl]
        [--write-model router/assets/classifier.json]
        [--write-sampled-model router/assets/classifier-sampled.json]
        [--write-examples FILE] [--plot docs/img/router_eval.png] [--plot-mix FILE]
        [--check FILE ...] [--repeat FILE ...] [--quick]

1. Builds the labelled sets (and prints each group's mean score on both tiers): the
   checkable tasks of ``bench.router_tasks`` (BFCL, HumanEval, reasoning-gym at three
   difficulties, exact-answer questions) joined with the checked answers of both embedded
   tiers from ``bench.router_outcomes``, for two serving regimes: greedy (one answer at
   temperature 0) and sampled (the mean of four answers at temperature 0.7, ``--samples 4``).
   Label: 1 when the full tier scored more than 0.25 above the fast tier.
2. For each regime, splits the set (70/30, stratified by source and category, seed 0),
   trains a classifier on the 70% (``router.training``) and reports on the held-out 30%,
   for the classifier and every baseline (always full, always fast, random, length
   threshold, rules): AUC against the held-out labels, and APGR and CPT(50%)/CPT(80%) as
   RouteLLM defines them over the real outcomes; also the other regime's model on the same
   tasks (what routing these requests with it would give). The same
   figures averaged over five more splits show how much of the difference is the split.
3. Reports both classifiers' fast-tier share on MT-Bench's categories (no checker exists
   for those answers, so they are not in the figures above).
4. ``--check FILE`` (repeatable): both seed-0 models on other outcomes, such as answers
   sampled at another temperature for a subset of the tasks (``bench.router_outcomes
   --samples 4 --temperature 0.3 --scale 0.25``), on the held-out tasks they cover: which
   model routes requests at that temperature better. ``--repeat FILE``: the same for a
   second collection of a shipped regime (same samples, temperature and fast tier), and how
   well that regime's labels repeat (``repeat``: the share labelled alike, the AUC of the
   shipped labels as a router).

``--write-model`` / ``--write-sampled-model`` save the models trained on the seed-0
training split (the ones whose held-out figures are printed): the files the repo ships,
used by the classifier policy for greedy and for sampled requests. Last line: one JSON
object with the greedy regime's ``auc``, ``apgr``, ``apgr_best_baseline``, ``cpt50``,
``cpt80``, and the same for the sampled regime under ``sampled``.
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

from bench.router_outcomes import DEFAULT_OUT, SAMPLED_OUT, header, load
from bench.router_plots import fine_group, plot, plot_mix
from bench.router_tasks import Task, all_tasks
from router.classifier import Classifier, write_model
from router.dataset import write_examples
from router.evaluation import auc
from router.report import BASELINES, CHAINS, best_baseline, compare, metrics
from router.training import DEFAULT_MARGIN, Example, fit, split

REPEATS = 5
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


def group_ceiling(
    train: list[Example], test: list[Example], margin: float, scores: list[float]
) -> dict[str, float]:
    """AUC of scoring each held-out task by its group's positive rate: from the training
    split (a router that knew every task's group) and from the held-out split itself (an
    oracle), and that oracle with the classifier's ``scores`` breaking ties (a router that
    knew the groups perfectly and ranked tasks within them as the classifier does): how
    much of the label is group-level, and how much is per-task noise."""
    labels = [e.label(margin) for e in test]

    def rates(examples: list[Example]) -> dict[str, float]:
        by: dict[str, list[int]] = defaultdict(list)
        for e in examples:
            by[fine_group(e)].append(e.label(margin))
        return {k: statistics.fmean(v) for k, v in by.items()}

    prior, oracle = rates(train), rates(test)
    # group rates differ by far more than 1e-3 and scores lie in [0, 1]: they only break ties
    tied = [oracle[fine_group(e)] + 1e-3 * p for e, p in zip(test, scores, strict=True)]
    return {
        "auc_group_prior": round(auc([prior.get(fine_group(e), 0.0) for e in test], labels), 4),
        "auc_group_oracle": round(auc([oracle[fine_group(e)] for e in test], labels), 4),
        "auc_group_oracle_with_classifier": round(auc(tied, labels), 4),
    }


def within_groups(test: list[Example], scores: list[float], margin: float) -> dict[str, float]:
    """The classifier's AUC among the held-out tasks of each group that has both labels:
    whether it ranks tasks within a group, not only groups."""
    by: dict[str, tuple[list[float], list[int]]] = defaultdict(lambda: ([], []))
    for e, p in zip(test, scores, strict=True):
        by[fine_group(e)][0].append(p)
        by[fine_group(e)][1].append(e.label(margin))
    return {g: round(auc(ps, ys), 4) for g, (ps, ys) in sorted(by.items()) if 0 < sum(ys) < len(ys)}


@dataclass
class Regime:
    """One serving regime's evaluation: a model trained and tested on its outcomes for each
    split (seed 0 first), with the other regime's models tested on the same split."""

    name: str
    examples: list[Example]
    runs: list[dict[str, Any]] = field(default_factory=list)
    models: list[Classifier] = field(default_factory=list)
    specs: list[dict[str, Any]] = field(default_factory=list)
    tests: list[list[Example]] = field(default_factory=list)
    source: Path | None = None  # the outcomes file, once run

    def run(self, args: argparse.Namespace, source: Path) -> None:
        self.source = source
        grid = {"l2_grid": QUICK_L2} if args.quick else {}
        for seed in range((1 if args.quick else REPEATS) + 1):
            train, test = split(self.examples, 0.3, seed)
            meta = {"split_seed": seed, "outcomes": _shown(source), "regime": self.name}
            if "fast_tier" in header(source):
                meta["fast_tier"] = header(source)["fast_tier"]
            spec = fit(train, seed=seed, margin=args.margin, meta=meta, **grid)
            model = Classifier(spec)
            report = compare(model, test, margin=args.margin)
            scores = [model.predict(e.body, e.session).probability for e in test]
            report["ceiling"] = group_ceiling(train, test, args.margin, scores)
            report["within_groups"] = within_groups(test, scores, args.margin)
            self.runs.append(report)
            self.models.append(model)
            self.specs.append(spec)
            self.tests.append(test)

    def cross(self, other: Regime, margin: float) -> None:
        """The other regime's models on this regime's held-out tasks (the same tasks: the
        splits depend on task ids only)."""
        for seed, (report, test) in enumerate(zip(self.runs, self.tests, strict=True)):
            scores = [other.models[seed].predict(e.body).probability for e in test]
            report[f"{other.name}_model"] = metrics(scores, test, margin)

    def mean(self, name: str, key: str) -> float:
        return round(statistics.fmean(r[name][key] for r in self.runs[1:]), 4)

    def print(self, other: Regime) -> None:
        report = self.runs[0]
        names = ["classifier", f"{other.name}_model", *CHAINS, *BASELINES, "random"]
        print(f"\n{self.name} serving: held-out split (seed 0): {report['tiers']}", file=sys.stderr)
        print(f"{'router':24} {'AUC':>6} {'APGR':>6} {'CPT50':>6} {'CPT80':>6}   mean of {len(self.runs) - 1} more splits: AUC  APGR", file=sys.stderr)  # fmt: skip
        for name in names:
            r = report[name]
            print(f"{name:24} {r['auc']:6.3f} {r['apgr']:6.3f} {r['cpt50']:6.3f} {r['cpt80']:6.3f}"
                  f"   {self.mean(name, 'auc'):>30.3f} {self.mean(name, 'apgr'):.3f}", file=sys.stderr)  # fmt: skip
        ceiling = self.ceiling()
        print(f"AUC if each task's group (source/category/difficulty) were known, mean of all "
              f"splits: rate from training {ceiling['auc_group_prior']:.3f}, "
              f"oracle rate from the held-out split {ceiling['auc_group_oracle']:.3f}, "
              f"oracle with the classifier breaking ties {ceiling['auc_group_oracle_with_classifier']:.3f}", file=sys.stderr)  # fmt: skip
        within = self.within()
        print("classifier AUC within a group (mean of the splits where it has both labels): "
              + ", ".join(f"{g} {a:.2f}" for g, a in within.items()), file=sys.stderr)  # fmt: skip
        at = report["at_threshold"]
        print(f"at the model's threshold {at['threshold']:.3f}: {at['full_share']:.0%} of steps "
              f"on full, PGR {at['pgr']:.2f}", file=sys.stderr)  # fmt: skip

    def within(self) -> dict[str, float]:
        by: dict[str, list[float]] = defaultdict(list)
        for r in self.runs:
            for g, a in r["within_groups"].items():
                by[g].append(a)
        return {g: round(statistics.fmean(v), 4) for g, v in sorted(by.items())}

    def ceiling(self) -> dict[str, float]:
        keys = self.runs[0]["ceiling"]
        return {k: round(statistics.fmean(r["ceiling"][k] for r in self.runs), 4) for k in keys}

    def summary(self, other: Regime) -> dict[str, Any]:
        report = self.runs[0]
        base, base_apgr = best_baseline(report)
        out = {
            "auc": report["classifier"]["auc"],
            "apgr": report["classifier"]["apgr"],
            "apgr_best_baseline": base_apgr,
            "best_baseline": base,
            "cpt50": report["classifier"]["cpt50"],
            "cpt80": report["classifier"]["cpt80"],
            "auc_mean_splits": self.mean("classifier", "auc"),
            "apgr_mean_splits": self.mean("classifier", "apgr"),
            "apgr_best_baseline_mean_splits": max(
                self.mean(k, "apgr") for k in (*BASELINES, "random")
            ),
            "held_out": report["tiers"],
            "ceiling_mean_splits": self.ceiling(),
            "auc_within_groups_mean_splits": self.within(),
            "at_threshold": report["at_threshold"],
        }
        name = f"{other.name}_model"
        out[name] = {**report[name], "mean_splits": {k: self.mean(name, k) for k in ("auc", "apgr")}}  # fmt: skip
        return out


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


def _how(path: Path) -> tuple[Any, Any]:
    """How a file's answers were sampled: (answers per task, temperature)."""
    h = header(path)
    samples = h.get("samples", 1)
    return samples, (0.0 if samples == 1 else h.get("temperature"))


def check(
    path: Path,
    tasks: list[Task],
    greedy: Regime,
    sampled: Regime,
    margin: float,
    repeat: bool = False,
) -> dict[str, Any]:
    """Both seed-0 models on other outcomes (another temperature, any subset of the tasks):
    AUC and APGR on the seed-0 held-out tasks those outcomes cover. With ``repeat`` (the
    file collects a shipped regime again, with the same fast tier), also how well that
    regime's labels repeat."""
    rows = load(path)
    held_out = {e.id for e in greedy.tests[0]}
    covered = examples_from([t for t in tasks if t.key in rows], rows)
    examples = [e for e in covered if e.id in held_out]
    # the shipped fast tier's scores from the regime the file was collected in (sampled rows
    # keep each answer's score; older files have no "samples" in their header)
    was_sampled = any(len(r["fast"].get("scores", ())) > 1 for r in rows.values())
    same_regime = sampled if was_sampled else greedy
    out: dict[str, Any] = {"tasks": len(examples),
                           "positives": sum(e.label(margin) for e in examples),
                           "tiers": tier_sums(covered, same_regime.examples)}  # fmt: skip
    if repeat:
        assert same_regime.source is not None
        if _how(path) != _how(same_regime.source):
            raise SystemExit(
                f"--repeat {path}: collected with (samples, temperature) {_how(path)}, the "
                f"shipped {same_regime.name} outcomes with {_how(same_regime.source)}; "
                "use --check for outcomes of another regime"
            )
        out["repeat"] = repeatability(covered, same_regime.examples, margin)
    for regime in (greedy, sampled):
        scores = [regime.models[0].predict(e.body).probability for e in examples]
        try:
            out[f"{regime.name}_model"] = metrics(scores, examples, margin)
        except ValueError as exc:  # too few tasks: no positives, or no quality gap
            raise SystemExit(f"--check {path}: {exc}") from None
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--outcomes", type=Path, default=DEFAULT_OUT, help="greedy outcomes")
    parser.add_argument(
        "--sampled-outcomes", type=Path, default=SAMPLED_OUT,
        help="outcomes sampled at T=0.7 (bench.router_outcomes --samples 4)",
    )  # fmt: skip
    parser.add_argument("--write-model", type=Path, help="save the seed-0 greedy model here")
    parser.add_argument(
        "--write-sampled-model", type=Path, help="save the seed-0 sampled model here"
    )
    parser.add_argument("--write-examples", type=Path, help="save the greedy labelled set")
    parser.add_argument(
        "--check", type=Path, action="append", default=[],
        help="more outcomes (e.g. --samples 4 --temperature 0.3 --scale 0.25): both models on "
        "their held-out tasks; repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=Path, action="append", default=[],
        help="a second collection of a shipped regime (same samples, temperature and fast "
        "tier; e.g. --scale 0.25): --check, and how well the labels repeat; repeatable",
    )  # fmt: skip
    parser.add_argument("--plot", type=Path, help="PGR curves of every router (PNG)")
    parser.add_argument("--plot-mix", type=Path, help="routing mix by task group (PNG)")
    parser.add_argument(
        "--margin", type=float, default=DEFAULT_MARGIN,
        help="label 1 when the full score exceeds the fast score by more than this",
    )  # fmt: skip
    parser.add_argument(
        "--quick", action="store_true",
        help=f"one more split instead of {REPEATS}, L2 fixed at {QUICK_L2[0]}: a smoke run",
    )  # fmt: skip
    args = parser.parse_args()

    tasks = all_tasks()
    greedy = Regime("greedy", examples_from(tasks, load(args.outcomes)))
    sampled = Regime("sampled", examples_from(tasks, load(args.sampled_outcomes), SAMPLED_COMMAND))
    if args.write_examples:
        write_examples(args.write_examples, greedy.examples)
    groups = Counter(e.group for e in greedy.examples)
    print(f"{len(greedy.examples)} checkable tasks in {len(groups)} groups", file=sys.stderr)
    for regime in (greedy, sampled):
        print(f"\n{regime.name} outcomes:", file=sys.stderr)
        print_groups(regime.examples, args.margin)

    greedy.run(args, args.outcomes)
    sampled.run(args, args.sampled_outcomes)
    greedy.cross(sampled, args.margin)
    sampled.cross(greedy, args.margin)
    greedy.print(sampled)
    sampled.print(greedy)

    checks = {
        _shown(path): check(path, tasks, greedy, sampled, args.margin, repeat=path in args.repeat)
        for path in [*args.check, *args.repeat]
    }
    for name, c in checks.items():
        print(f"\n{name}: {c['tasks']} held-out tasks, {c['positives']} labelled 'needs full'", file=sys.stderr)  # fmt: skip
        for model in ("greedy_model", "sampled_model"):
            print(f"  {model:14} AUC {c[model]['auc']:.3f}  APGR {c[model]['apgr']:.3f}", file=sys.stderr)  # fmt: skip
        print(f"  {'tier scores':14} {'tasks':>5} {'full':>6} {'fast':>6} {'shipped fast':>18}", file=sys.stderr)  # fmt: skip
        for source, t in c["tiers"].items():
            print(f"  {source:14} {t['tasks']:5.0f} {t['full']:6.1f} {t['fast']:6.1f} {t['fast_outcomes']:18.1f}", file=sys.stderr)  # fmt: skip
        if "repeat" in c:
            r = c["repeat"]
            known = "n/a" if r["auc_known_labels"] is None else f"{r['auc_known_labels']:.3f}"
            print(f"  the same regime collected again: {r['tasks']} tasks, labels alike on "
                  f"{r['label_agreement']:.1%} ('needs full' {r['positives'][0]} then "
                  f"{r['positives'][1]}); AUC of the shipped labels as a router: {known}", file=sys.stderr)  # fmt: skip

    mtbench = {r.name: mtbench_mix(r.models[0], tasks) for r in (greedy, sampled)}
    print(f"\nMT-Bench fast-tier share by category: {mtbench}", file=sys.stderr)

    for path, regime in ((args.write_model, greedy), (args.write_sampled_model, sampled)):
        if path:
            write_model(regime.specs[0], path)
    if args.plot:
        plot(args.plot, greedy.models[0], greedy.tests[0], greedy.runs[0])
    if args.plot_mix:
        plot_mix(args.plot_mix, greedy.models[0], greedy.tests[0], tasks)

    report = greedy.runs[0]
    summary = {
        **greedy.summary(sampled),
        "mtbench_fast_share": mtbench,
        "baselines": {k: report[k] for k in (*BASELINES, "random")},
        "chains": {
            k: {**report[k], "mean_splits": {m: greedy.mean(k, m) for m in ("auc", "apgr")}}
            for k in CHAINS
        },
        "sampled": sampled.summary(greedy),
        "checks": checks,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
