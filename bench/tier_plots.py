"""The speed/quality frontier of the fast-tier candidates from one ``bench.tiers`` run.

    python -m bench.tiers --levers pruned-ngram,full-suffix ... | tee tiers.out
    python -m bench.tier_plots tiers.out docs/img/tier-frontier.png

Reads the run's last line (one JSON object; for a run stopped after its speed cells, the
workload lines it printed, with ``--quality ARM=R:LOW:HIGH`` for retention measured
elsewhere) and draws, for each measured arm, the time-per-
answer speed-up at concurrency 1 and the requests/s speed-up at concurrency 4 (task prompts)
against its quality retention on the headline side of the locked split, with the 95%
bootstrap interval as a bar. The full tier is the point (1, 1); the issue's target (2x at
0.9 retention) is drawn as a corner. Prints one JSON line: the points it drew.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TARGET_SPEEDUP, TARGET_RETENTION = 2.0, 0.9


def read_run(path: Path) -> dict[str, Any]:
    """The run's result: its last line, or, for a run stopped before its quality cells, the
    speed figures of the ``{"workload": ...}`` lines it printed on the way."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip().startswith("{")]
    finished = [x for x in lines if "arms" in x]
    result: dict[str, Any] = {"arms": {}, "quality_side": "test"}
    if finished:
        result = finished[-1]
        return result
    for line in lines:
        workload = line.pop("workload", None)
        for arm, figures in line.items() if workload else ():
            result["arms"].setdefault(arm, {"speed": {}})["speed"][workload] = figures
    if not result["arms"]:
        raise SystemExit(f"{path}: no result or workload line")
    return result


def add_quality(result: dict[str, Any], given: list[str]) -> None:
    """``ARM=RETENTION[:LOW:HIGH][@SOURCE]`` measured elsewhere (e.g. ``--quality-from``
    stored outcomes for a tier, or 1.0 for a greedy-verified lossless arm)."""
    for item in given:
        arm, _, value = item.partition("=")
        value, _, source = value.partition("@")
        numbers = [float(v) for v in value.split(":")]
        if arm not in result["arms"] or len(numbers) not in (1, 3):
            raise SystemExit(f"--quality {item!r}: ARM=RETENTION[:LOW:HIGH][@SOURCE], a run's arm")
        ci = numbers[1:] if len(numbers) == 3 else [None, None]
        greedy = {"quality_retention": numbers[0], "ci": ci, "tasks": None, "from": source}
        result["arms"][arm]["quality"] = {"greedy": greedy}


def points(result: dict[str, Any], workload: str = "tasks") -> list[dict[str, Any]]:
    """One point per candidate arm with both a speed (on ``workload``) and a quality figure."""
    out = []
    for name, arm in result.get("arms", {}).items():
        speed = arm.get("speed", {}).get(workload, {})
        quality = arm.get("quality", {})
        greedy = quality.get("greedy") or quality.get("sampled") or {}
        c1, c4 = speed.get("answer_speedup_c1"), speed.get("rps_speedup_c4")
        if c1 is None or not greedy:
            continue
        ci = greedy.get("ci") or [None, None]
        out.append(
            {
                "arm": name,
                "workload": workload,
                "answer_speedup_c1": c1,
                "rps_speedup_c4": c4,
                "length_ratio_c1": speed.get("length_ratio_c1"),
                "retention": greedy.get("quality_retention"),
                "ci": ci,
                "tasks": greedy.get("tasks"),
                "quality_from": greedy.get("from"),
            }
        )
    return out


def plot(result: dict[str, Any], out: Path, workload: str = "tasks") -> list[dict[str, Any]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn = points(result, workload)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    for ax, key, title in (
        (axes[0], "answer_speedup_c1", "time per answer, concurrency 1"),
        (axes[1], "rps_speedup_c4", "requests/s, concurrency 4"),
    ):
        ax.scatter([1.0], [1.0], marker="s", color="black", label="full (plain)")
        noted = 0
        for p in drawn:
            if p[key] is None or p["retention"] is None:
                continue
            low, high = p["ci"]
            err = None
            if low is not None and high is not None:
                err = [[max(p["retention"] - low, 0)], [max(high - p["retention"], 0)]]
            ax.errorbar([p[key]], [p["retention"]], yerr=err, fmt="o", capsize=3, label=p["arm"])
            length = p["length_ratio_c1"]
            if length is not None and abs(length - 1) > 0.05:  # shorter is not faster
                ax.annotate(
                    f"{p['arm']}: {length:.2f}x tokens",
                    (p[key], p["retention"]),
                    textcoords="offset points",
                    xytext=(-8, 10 + 11 * noted),
                    ha="right",
                    fontsize=7,
                )
                noted += 1
        ax.axvline(TARGET_SPEEDUP, color="grey", linestyle=":", linewidth=1)
        ax.axhline(TARGET_RETENTION, color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel(f"speed-up vs full ({title})")
        ax.set_title(title)
        ax.set_xlim(left=0)
        ax.grid(alpha=0.3)
    side = result.get("quality_side", "test")
    axes[0].set_ylabel(f"quality retention, {side} split (95% CI)")
    axes[1].legend(loc="upper right", fontsize=8)
    fig.suptitle(
        f"Fast-tier candidates on {workload!r} prompts: speed against quality "
        "(dotted: the 2x / 0.9 target)"
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("run", type=Path, help="a bench.tiers output (its last JSON line is read)")
    p.add_argument("out", type=Path, help="the PNG to write")
    p.add_argument("--workload", default="tasks", help="the speed workload: tasks, repetitive")
    p.add_argument("--quality", action="append", default=[], metavar="ARM=R[:LOW:HIGH][@SOURCE]",
                   help="an arm's quality retention measured elsewhere")  # fmt: skip
    args = p.parse_args(argv)
    result = read_run(args.run)
    add_quality(result, args.quality)
    drawn = plot(result, args.out, args.workload)
    print(json.dumps({"plot": str(args.out), "points": drawn}), flush=True)
    return drawn


if __name__ == "__main__":
    main()
