"""Learning the router from logged decisions, measured against learning with full information.

    python -m bench.router_offpolicy [--explore 0.1,0.25,0.5] [--passes 3] [--seeds 3] [--quick]

Production logs one tier's outcome per step. This simulates such a log from the real greedy
outcomes of both embedded tiers (``bench.router_outcomes``): every task of the dev
side of the locked split (``bench.router_split``) is routed ``--passes`` times (traffic repeats) by the
shipped greedy classifier with ``explore`` set (the real policy; each pass is another
session, so another exploration coin); the log keeps the chosen tier, its propensity and
that tier's checked score as the reward. ``router.offpolicy`` (what ``gearshift router train
--from-store`` runs) trains on the log, and the model is scored on the locked test tasks against
the full-information labels, next to:

* the full-information model (``router.training`` on both tiers' outcomes of the same
  training tasks): what a perfect log could give;
* the same log without the importance weights (each step weighted by its reward's distance
  from the mean only): what ignoring the propensities gives;
* the logging policy itself.

Rewards are the checked scores (0..1); the full tier must earn ``--cost`` (0.25, the label
margin of the full-information model) more to be preferred. One L2 strength (``--l2``,
the full-information model's choice) keeps the run short. Last line: one JSON object with
``auc`` and ``apgr`` of the off-policy model (mean over seeds) at each exploration rate.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import numpy as np

from bench.router_eval import examples_from
from bench.router_outcomes import DEFAULT_OUT, load
from bench.router_split import load as load_split
from bench.router_tasks import all_tasks
from router.classifier import Classifier
from router.offpolicy import Logged, fit_logged
from router.policy import build_policy
from router.report import metrics
from router.training import DEFAULT_MARGIN, Example, fit
from router.types import RouteRequest, Tier


def log_traffic(train: list[Example], explore: float, passes: int, seed: int) -> list[Logged]:
    policy = build_policy("classifier", {"explore": explore, "sampled_model": None})
    logged = []
    for k in range(passes):
        for ex in train:
            decision = policy.decide(
                RouteRequest("chat", ex.body, session_id=f"s{seed}-p{k}-{ex.id}")
            )
            reward = ex.full if decision.tier is Tier.FULL else ex.fast
            logged.append(Logged(f"{ex.id}#{k}", ex.body, decision.tier, decision.propensity, reward, ex.group))  # fmt: skip
    return logged


def held_out(spec: dict[str, Any], test: list[Example]) -> dict[str, float]:
    model = Classifier(spec)
    return metrics([model.predict(ex.body).probability for ex in test], test, DEFAULT_MARGIN)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--explore", default="0.1,0.25,0.5", help="exploration rates to log at")
    parser.add_argument("--passes", type=int, default=3, help="times each training task is routed")
    parser.add_argument("--seeds", type=int, default=3, help="logs per exploration rate")
    parser.add_argument("--cost", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--l2", type=float, default=0.003)
    parser.add_argument(
        "--quick", action="store_true", help="one log at one exploration rate: a smoke run"
    )
    args = parser.parse_args()
    if args.quick:
        args.explore, args.passes, args.seeds = "0.25", 1, 1

    examples = examples_from(all_tasks(), load(DEFAULT_OUT))
    locked = (
        load_split()
    )  # the shipped model was trained on the dev side: log that, test on the rest
    train = [e for e in examples if e.id in locked.dev]
    test = [e for e in examples if e.id in locked.test]
    print(f"{len(train)} training tasks, {len(test)} held out", file=sys.stderr)
    full_info = held_out(fit(train, l2_grid=(args.l2,)), test)
    logging = held_out(Classifier.load().spec, test)  # the shipped greedy model
    print(f"full information: {full_info}\nlogging policy:   {logging}", file=sys.stderr)

    rows: dict[str, Any] = {}
    for explore in (float(e) for e in args.explore.split(",")):
        runs: dict[str, list[dict[str, float]]] = {"ips": [], "unweighted": []}
        for seed in range(args.seeds):
            logged = log_traffic(train, explore, args.passes, seed)
            full_share = float(np.mean([s.tier is Tier.FULL for s in logged]))
            spec = fit_logged(logged, cost=args.cost, l2_grid=(args.l2,), seed=seed)
            runs["ips"].append(held_out(spec, test))
            flat = [Logged(s.id, s.body, s.tier, 1.0, s.reward, s.group) for s in logged]
            runs["unweighted"].append(held_out(fit_logged(flat, cost=args.cost, l2_grid=(args.l2,), seed=seed), test))  # fmt: skip
            print(f"explore {explore} seed {seed}: {len(logged)} steps, full share {full_share:.2f}, "
                  f"ips {runs['ips'][-1]}, unweighted {runs['unweighted'][-1]}", file=sys.stderr)  # fmt: skip
        rows[str(explore)] = {
            name: {k: round(statistics.mean(r[k] for r in rs), 4) for k in ("auc", "apgr")}
            | {"auc_min": round(min(r["auc"] for r in rs), 4)}
            for name, rs in runs.items()
        }
    print(
        json.dumps({"full_information": full_info, "logging_policy": logging, "off_policy": rows})
    )


if __name__ == "__main__":
    main()
