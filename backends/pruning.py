"""Layer pruning with optional healing: build a same-family fast variant of a checkpoint.

Run in the engine environment (it needs torch and transformers), usually through
``gearshift prune``; ``python -m backends.pruning --help`` works too.

Importance is measured on calibration text (``backends/assets/calibration.jsonl`` by
default: chat exchanges rendered with the model's own chat template):

* ``block-influence`` (ShortGPT, arXiv 2403.03853): BI_i = 1 - E[cos(x_i, y_i)] between a
  layer's input and output hidden states; the N layers that change their input least go.
* ``angular`` (Gromov et al., arXiv 2403.17887): d(l, l+n) = E[arccos(cos(x_l, x_{l+n}))]/pi
  between the inputs of layers n apart; the contiguous block of n layers starting at the
  argmin goes.

The kept layers are renumbered and the checkpoint is written with its config, safetensors
weights, tokenizer files and chat template, so transformers and vLLM load it as the same
family. ``--heal-steps K`` then distils the pruned model toward the full one (KL on the
logits) and the report gives held-out perplexity before and after. What it distils on is
``--heal-data``: the calibration text (default), ``self`` (conversations the full model
writes itself, requests and answers, ``backends/selfdata.py``; needs vLLM) or a JSONL file
in the calibration format; the calibration samples not held out for perplexity join them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

DEFAULT_CALIBRATION = Path(__file__).with_name("assets") / "calibration.jsonl"
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
REPORT = "gearshift-prune.json"
HEAL_DATA = "gearshift-heal-data.jsonl"  # kept next to the weights: what healing saw


class PruneError(RuntimeError):
    """The checkpoint or the options cannot be pruned as asked."""


def load_texts(path: Path, tokenizer: Any) -> list[str]:
    texts = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PruneError(f"{path}:{n}: not JSON ({exc})") from None
        if "messages" in item:
            # with their tools: rows of `gearshift export --format trl-sft` render as served
            texts.append(
                tokenizer.apply_chat_template(
                    item["messages"], tools=item.get("tools") or None, tokenize=False
                )
            )
        elif isinstance(item.get("text"), str):
            texts.append(item["text"])
        else:
            raise PruneError(f"{path}:{n}: needs a 'messages' list or a 'text' string")
    if len(texts) < 4:
        raise PruneError(f"{path}: at least 4 calibration samples are needed, found {len(texts)}")
    return texts


def batches(tokenizer: Any, texts: Sequence[str], max_len: int) -> list[Any]:
    """One sample per batch: no padding, so every position is real text."""
    return [
        tokenizer(t, return_tensors="pt", truncation=True, max_length=max_len)["input_ids"]
        for t in texts
    ]


def _layers(model: Any) -> Any:
    return model.model.layers


def _capture_layer_inputs(model: Any, ids: Any) -> list[Any]:
    """Hidden states entering each decoder layer, plus the last layer's output: L + 1 tensors."""
    import torch

    captured: list[Any] = []
    handles = []
    layers = _layers(model)

    def pre_hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        captured.append(hidden.detach()[0].float())

    def last_hook(module: Any, args: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        captured.append(hidden.detach()[0].float())

    for layer in layers:
        handles.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))
    handles.append(layers[-1].register_forward_hook(last_hook))
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return captured


def importance(
    model: Any, data: Sequence[Any], method: str, remove: int, progress: bool
) -> list[float]:
    """Per-layer scores (block-influence) or per-start-layer distances (angular)."""
    import torch
    from tqdm import tqdm

    n_layers = len(_layers(model))
    sums = torch.zeros(
        n_layers if method == "block-influence" else n_layers - remove + 1, dtype=torch.float64
    )
    count = 0
    for ids in tqdm(data, desc=f"measuring layer importance ({method})", disable=not progress):
        states = _capture_layer_inputs(model, ids)
        if method == "block-influence":
            for i in range(n_layers):
                cos = torch.nn.functional.cosine_similarity(states[i], states[i + 1], dim=-1)
                sums[i] += (1 - cos).sum().item()
        else:
            for start in range(n_layers - remove + 1):
                cos = torch.nn.functional.cosine_similarity(
                    states[start], states[start + remove], dim=-1
                )
                sums[start] += (torch.arccos(cos.clamp(-1, 1)) / math.pi).sum().item()
        count += states[0].shape[0]
    return (sums / count).tolist()


def choose(method: str, scores: Sequence[float], remove: int) -> list[int]:
    if method == "block-influence":
        order = sorted(range(len(scores)), key=lambda i: (scores[i], i))
        return sorted(order[:remove])
    start = min(range(len(scores)), key=lambda i: (scores[i], i))
    return list(range(start, start + remove))


def drop_layers(model: Any, removed: Sequence[int]) -> None:
    """Remove decoder layers in place and renumber what is left."""
    import torch

    layers = _layers(model)
    kept = [layer for i, layer in enumerate(layers) if i not in set(removed)]
    model.model.layers = torch.nn.ModuleList(kept)
    for new_index, layer in enumerate(kept):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "layer_idx"):
            attn.layer_idx = new_index
    cfg = model.config
    layer_types = getattr(cfg, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == len(layers):
        cfg.layer_types = [t for i, t in enumerate(layer_types) if i not in set(removed)]
    for attr in ("max_window_layers",):  # Qwen2: layers beyond it use sliding windows
        if isinstance(getattr(cfg, attr, None), int):
            setattr(cfg, attr, min(getattr(cfg, attr), len(kept)))
    cfg.num_hidden_layers = len(kept)


def perplexity(model: Any, data: Sequence[Any]) -> float:
    import torch

    total, tokens = 0.0, 0
    with torch.no_grad():
        for ids in data:
            out = model(input_ids=ids, labels=ids, use_cache=False)
            n = ids.shape[1] - 1
            total += out.loss.item() * n
            tokens += n
    return math.exp(total / max(1, tokens))


def heal(
    student: Any, teacher: Any, data: Sequence[Any], steps: int, lr: float, progress: bool
) -> list[float]:
    """Knowledge distillation: minimise KL(teacher || student) over next-token distributions."""
    import torch
    import torch.nn.functional as F
    from tqdm import tqdm

    student.train()
    optimizer = torch.optim.AdamW(
        [p for p in student.parameters() if p.requires_grad], lr=lr, weight_decay=0.0
    )
    losses = []
    cycle: Iterator[Any] = iter(())
    for _ in tqdm(range(steps), desc="healing (distillation)", disable=not progress):
        ids = next(cycle, None)
        if ids is None:
            cycle = iter(random.sample(list(data), len(data)))
            ids = next(cycle)
        with torch.no_grad():
            target = F.log_softmax(teacher(input_ids=ids, use_cache=False).logits.float(), dim=-1)
        logits = student(input_ids=ids, use_cache=False).logits.float()
        loss = (
            F.kl_div(F.log_softmax(logits, dim=-1), target, log_target=True, reduction="batchmean")
            / ids.shape[1]
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    student.eval()
    return losses


def write_self_data(src: Path, path: Path, samples: int, seed: int, quiet: bool) -> dict[str, Any]:
    """The full model writes ``samples`` conversations to ``path`` (``backends.selfdata``, in a
    child process so vLLM's engine and memory are gone before training starts)."""
    stats = path.with_name(path.name + ".stats")
    command = [sys.executable, "-m", "backends.selfdata", str(src), str(path), "--stats", str(stats),
               "--samples", str(samples), "--seed", str(seed), *(["--quiet"] if quiet else [])]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    try:
        # vLLM logs to stdout and stderr; both pass through, the counts come back in a file
        if subprocess.run(command, env=env, check=False).returncode != 0:
            raise PruneError("the full model could not write its healing conversations (see above)")
        return dict(json.loads(stats.read_text()))
    finally:
        stats.unlink(missing_ok=True)


def self_data(args: argparse.Namespace, src: Path, scratch: Path) -> dict[str, Any]:
    """The full model's conversations at ``scratch``: written now, or copied from
    ``--self-data FILE`` when an earlier run wrote them there for the same model, sample count
    and seed (writing takes minutes and does not depend on what is pruned, so prunings of one
    model share it)."""
    made_by = {"source": src.resolve().name, "samples": args.heal_samples, "seed": args.seed}
    kept = Path(args.self_data) if args.self_data else None
    if kept is not None:
        kept_stats = kept.with_name(kept.name + ".stats.json")
        if kept.is_file() and kept_stats.is_file():
            try:
                stats = json.loads(kept_stats.read_text())
            except ValueError:
                stats = {}  # unreadable: written again below
            if stats.get("made_by") == made_by:
                shutil.copyfile(kept, scratch)
                return {**stats, "reused": str(kept)}
    started = time.monotonic()
    stats = write_self_data(src, scratch, args.heal_samples, args.seed, args.quiet)
    stats["seconds"] = round(time.monotonic() - started, 1)
    stats["made_by"] = made_by
    if kept is not None:  # data first, stats last: a stats file says its data is whole
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(kept.name + ".partial")
        shutil.copyfile(scratch, partial)
        partial.replace(kept)
        partial.write_text(json.dumps(stats))
        partial.replace(kept_stats)
    return stats


def healing_texts(
    args: argparse.Namespace, src: Path, tokenizer: Any, scratch: Path
) -> tuple[list[str], dict[str, Any]]:
    """What ``--heal-data`` names, as rendered text, and what to record about it."""
    if args.heal_data == "calibration":
        return [], {}
    if args.heal_data == "self":
        stats = self_data(args, src, scratch)
        return load_texts(scratch, tokenizer), stats
    path = Path(args.heal_data)
    if not path.is_file():
        raise PruneError(
            f"--heal-data {args.heal_data}: no such file; give 'calibration', 'self' or a JSONL file"
        )
    texts = load_texts(path, tokenizer)  # errors name the user's file, not the copy
    shutil.copyfile(path, scratch)
    return texts, {}


def copy_side_files(src: Path, out: Path) -> None:
    """Tokenizer, chat template and generation config travel unchanged."""
    for item in src.iterdir():
        if (
            item.is_file()
            and item.name not in {"config.json", REPORT, HEAL_DATA}
            and not item.name.endswith(WEIGHT_SUFFIXES)
            and not item.name.startswith(".")
        ):
            shutil.copy2(item, out / item.name)


def prune(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    random.seed(args.seed)
    src, out = Path(args.src), Path(args.out)
    arch, n_layers, remove = checked_amount(src, out, args, AutoConfig)
    tokenizer = AutoTokenizer.from_pretrained(src)
    texts = load_texts(Path(args.calibration), tokenizer)
    random.Random(args.seed).shuffle(texts)
    held_out = max(2, len(texts) // 5)
    calib = batches(tokenizer, texts[held_out:], args.max_len)
    evaluation = batches(tokenizer, texts[:held_out], args.max_len)
    scratch = scratch_path(out)
    extra, heal_stats = healing_texts(args, src, tokenizer, scratch)
    heal_set = calib + batches(tokenizer, extra, args.max_len)
    progress = not args.quiet
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.eval()
    started = time.monotonic()
    scores = importance(model, calib, args.method, remove, progress)
    removed = choose(args.method, scores, remove)
    report: dict[str, Any] = {
        "source": str(src), "architecture": arch, "method": args.method, "layers_before": n_layers,
        "layers_after": n_layers - remove, "removed": removed, "scores": [round(s, 6) for s in scores],
        "score_meaning": "1 - cos(in, out) per layer" if args.method == "block-influence"
        else f"angular distance between inputs of layers i and i+{remove}, per start layer i",
        "calibration": str(args.calibration), "calibration_samples": len(calib), "seed": args.seed,
    }  # fmt: skip
    ppl_full = perplexity(model, evaluation)
    teacher = None
    if args.heal_steps:
        teacher = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        teacher.eval()
    drop_layers(model, removed)
    report["perplexity"] = {
        "full": round(ppl_full, 3),
        "pruned": round(perplexity(model, evaluation), 3),
    }
    if teacher is not None:
        losses = heal(model, teacher, heal_set, args.heal_steps, args.lr, progress)
        report["perplexity"]["healed"] = round(perplexity(model, evaluation), 3)
        report["healing"] = {
            "steps": args.heal_steps,
            "lr": args.lr,
            "first_loss": round(losses[0], 4),
            "last_loss": round(losses[-1], 4),
            "data": args.heal_data,
            "samples": len(heal_set),
        }
        if heal_stats:
            report["healing"]["self_data"] = heal_stats
    report["seconds"] = round(time.monotonic() - started, 1)
    write_checkpoint(src, out, model.to(getattr(torch, args.dtype)), report, scratch)
    return report


def scratch_path(out: Path) -> Path:
    """Where healing data is written before the checkpoint folder exists."""
    return out.with_name(out.name + ".heal-data.jsonl")


def checked_amount(
    src: Path, out: Path, args: argparse.Namespace, auto_config: Any
) -> tuple[str, int, int]:
    """The architecture, its layer count and how many layers go, or a clear refusal."""
    if not (src / "config.json").is_file():
        raise PruneError(f"{src} is not a Hugging Face checkpoint folder (no config.json)")
    if out.resolve() == src.resolve():
        raise PruneError("the output folder must differ from the source")
    config = auto_config.from_pretrained(src)
    arch = (config.architectures or ["?"])[0]
    if arch not in SUPPORTED:
        raise PruneError(f"{arch} is not supported; layer pruning handles {', '.join(SUPPORTED)}")
    n_layers = config.num_hidden_layers
    remove = args.remove if args.remove is not None else round(n_layers * (1 - args.keep_ratio))
    if not 0 < remove < n_layers:
        raise PruneError(
            f"cannot remove {remove} of {n_layers} layers; keep at least one and remove at least one"
        )
    if args.heal_data != "calibration" and not args.heal_steps:
        raise PruneError(f"--heal-data {args.heal_data} needs --heal-steps")
    if args.self_data and args.heal_data != "self":
        raise PruneError("--self-data keeps what --heal-data self writes; add --heal-data self")
    return arch, n_layers, remove


def write_checkpoint(
    src: Path, out: Path, model: Any, report: dict[str, Any], heal_data: Path
) -> None:
    """Written next to ``out`` and renamed into place: a half-written folder is never served."""
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    copy_side_files(src, tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / REPORT).write_text(json.dumps(report, indent=2))
    if heal_data.exists():
        heal_data.rename(tmp / HEAL_DATA)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gearshift prune", description="Remove decoder layers from a checkpoint."
    )
    p.add_argument("src", help="Hugging Face checkpoint folder (Llama, Qwen2 or Mistral style)")
    p.add_argument("out", help="folder to write the pruned checkpoint to")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--remove", type=int, help="number of layers to remove")
    amount.add_argument("--keep-ratio", type=float, help="fraction of layers to keep, e.g. 0.75")
    p.add_argument("--method", choices=["block-influence", "angular"], default="block-influence")
    p.add_argument(
        "--calibration",
        default=str(DEFAULT_CALIBRATION),
        help="JSONL of {'messages': [...]} or {'text': ...}",
    )
    p.add_argument(
        "--heal-steps", type=int, default=0, help="distillation steps after pruning (0: none)"
    )
    p.add_argument(
        "--heal-data",
        default="calibration",
        help="what healing distils on: 'calibration' (the calibration text), 'self' (conversations "
        "the full model writes itself; needs vLLM) or a JSONL file like the calibration set",
    )
    p.add_argument(
        "--heal-samples", type=int, default=256, help="conversations written for --heal-data self"
    )
    p.add_argument(
        "--self-data",
        metavar="FILE",
        help="with --heal-data self: keep the written conversations in FILE and reuse them from "
        "there on later runs with the same model, --heal-samples and --seed",
    )
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--max-len", type=int, default=512, help="tokens per calibration sample")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.keep_ratio is not None and not 0 < args.keep_ratio < 1:
        print("gearshift prune: --keep-ratio must be between 0 and 1", file=sys.stderr)
        return 2
    if args.heal_samples < 4:
        print("gearshift prune: --heal-samples must be at least 4", file=sys.stderr)
        return 2
    try:
        report = prune(args)
    except PruneError as exc:
        print(f"gearshift prune: {exc}", file=sys.stderr)
        return 2
    finally:
        scratch_path(Path(args.out)).unlink(missing_ok=True)  # only left when pruning failed
    print(json.dumps({k: report[k] for k in ("removed", "layers_after", "perplexity")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
