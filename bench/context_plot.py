"""``bench.context --plot``: each strategy's prompt tokens (against ``none``) and accuracy on
the early questions with its bootstrap 95% interval, and the end task's where the sessions
have one (needs matplotlib: the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

NUDGE = 0.006  # x offset between neighbouring strategies' points


def plot(rows: dict[str, dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for i, (name, r) in enumerate(rows.items()):
        # strategies at the same tokens (mask and default often are) nudged apart to be seen
        x = (r.get("tokens_vs_none") or 1.0) + NUDGE * (i - len(rows) / 2)
        series = [("accuracy", "o", "")]
        if r.get("end_task") is not None:
            series.append(("end_task", "s", "none"))
        for key, marker, face in series:
            lo, hi = r[f"{key}_ci95"]
            y = r[key]
            ax.errorbar(x, y, yerr=[[y - lo], [hi - y]], fmt=marker, capsize=4, color=f"C{i}",
                        mfc=face or f"C{i}", label=name if key == "accuracy" else None)  # fmt: skip
    ax.set_xlabel("prompt tokens per step, share of none's")
    ax.set_ylabel("accuracy, 95% bootstrap interval over sessions\n"
                  "filled: early questions; hollow square: end task")  # fmt: skip
    ax.set_xlim(0, 1.1)
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"bench.context: {title}", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
