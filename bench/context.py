"""Context strategies on long agent sessions, measured in one run.

    python -m bench.context [--quick] [--upstream mock|real|reader [--reader 0.5b|1.5b]]
                            [--data PATH | --seeded]
                            [--sessions N] [--budget 0.5[,0.15]] [--strategies none,default]
                            [--plot docs/img/context_policies.png] [--show-answers]
                            [--skip N] [--records RECORDS.jsonl] [--window N]

The sessions replayed by default are stored: ``bench/data/context_sessions.jsonl.gz``
(``--data``), 200 tool loops of 22-30 calls whose outputs come from the sandbox's real
tools (``bench.context_sessions``; four families of task), each with three questions about
facts printed early (a total a script printed, a job's error code in its traceback, the
path of a file a script wrote) and an end task (the number the session's last call, a
check script, printed). ``--seeded`` (and ``--quick``) generate sessions from ``--seed``
instead: a task, then ``--steps`` tool calls whose outputs each hold one fact
(``port_<i> = <value>``; with ``--facts mixed``, the held-out shape, also an error, a path
or an identifier's line) among log lines, and one question about an early fact.
The last ``--replay`` steps of every session are sent through one gateway (each a chat
request with the whole history so far, one named session per strategy, as an agent
sends them), then each question after the whole history, a request apiece, which every
condensing strategy has condensed: ``QUESTION: earlier in this conversation, a tool's
output printed a line with port_<k> and its number. Without calling any tool, ...``.

Strategies (one API key each, ``context.keys`` in the gateway's config):

    none              no context management: the whole history (a 400 where it does
                      not fit the window)
    drop-oldest       drop the oldest turns (rungs: drop)
    mask              mask old tool outputs, then drop (rungs: mask, drop)
    summarize-fast    summarize on the fast tier, then drop (rungs: summarize, drop)
    summarize-full    the same on the full tier
    extractive        the same with the extractive summary (no model call)
    default-before    the ladder as it shipped before: bare placeholders, clearing to just
                      under the budget (clear_to_fraction 1, mask_digest_chars 0)
    default-mask      the ladder before #24's fourth pass: masking stops once it leaves
                      the room, above the low-water mark (summarize_to_mark false)
    default-fast      the shipped ladder until 2026-12-03: the fast tier writes the
                      summarize rung's summary (decisions/context-summarizer.md)
    default           the shipped ladder: mask (placeholders with a digest), summarize
                      (extractive), drop; a clearing aims at half the budget, and one that
                      masking leaves above it goes on with the extractive summary

The strategies alternate: session ``i`` goes through every strategy, starting with the
``i``-th, so all arms see the same sessions (greedy decoding) on the same machine state.
Per strategy: time per step and per answer (ms, mean and p95, summaries included), prompt
tokens sent (mean per step, and total), accuracy on the early questions (the first number,
code or path of the answer is the value; ``exact``: the answer is the value alone;
bench.context_measure) with a bootstrap 95% interval over sessions (a session's score: the
share of its questions answered), per family of session too, and the end task's success,
each with its ratio to ``none``; fresh summaries
written (and per session) and fast-tier fallbacks; the share of steps whose prompt extends
the previous step's (its token ids, ``return_token_ids``: the prefix a clearing keeps) and
the mean share of the previous prompt they start with; on the real stack, the full tier's
prefix-cache hit rate (vLLM's counters, the cache emptied before each session's arm).
Several budgets (``--budget 0.15,0.5``) run one after the other on the same servers.
``--upstream mock`` (bench.context_upstream) answers the question by reading the prompt (its accuracy: the
facts a strategy kept in what the model saw) and cannot write a summary; ``--upstream
real`` starts the embedded stack (two vLLM servers) and the models answer (its window is
4096 tokens: most stored sessions do not fit it whole, and ``none`` gets a 400 there);
``--upstream reader`` serves Qwen2.5-Coder-0.5B-Instruct (``--reader 1.5b``: the
1.5B; ``python -m bench.reader_model [--reader 1.5b]`` provisions it) as both tiers from
one vLLM server, window 16384: the sessions fit whole. ``--window N`` sets the tiers'
context window instead (mock: its ``max_model_len`` and the length above which it answers
vLLM's context-length 400; reader: vLLM's ``--max-model-len``; both: the gateway's
``window_tokens``), and the budget stays a share of it. A session *fits* when ``none``
got no context-length 400 on any of its requests; where some do not, each budget's table
is followed by the sessions that fit and those that do not, and the headline
(``prompt_tokens_saved``, ``accuracy_vs_none`` with its paired bootstrap 95% interval
``accuracy_vs_none_ci95``: sessions resampled, both arms together) is on the sessions that
fit, as issue #24 defines it; ``accuracy_not_fitting`` gives each strategy's accuracy on
the others (``none``'s: its 400s, 0).
``--plot`` draws tokens against accuracy per strategy (bench.context_plot). The last line
is JSON. A long run that may be cut short: ``--records`` appends each (session, strategy)
as it ends (its tally and its answers), ``--skip N`` starts at the data's session ``N``
(batch ``k`` of ``N``: ``--skip kN --sessions N``; a session's index, not its place in
the batch, orders its arms), and ``python -m bench.context_combine RECORDS...`` reads
the records back as one run's table. Batches run in separate gateways, whose token
calibration starts afresh each time, so their condensed prompts may differ by a few
percent from one long run's.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import random
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench import reader_model
from bench.context_data import DATA, SYSTEM, Question, load
from bench.context_measure import PrefixCache, Score, Tally, extends, score
from bench.context_plot import plot
from bench.mock_upstream import MAX_MODEL_LEN
from bench.procs import start, stop, wait_http
from bench.stack import free_port, serve

ROOT = Path(__file__).resolve().parents[1]
LADDER = ["mask", "summarize", "drop"]
STRATEGIES: dict[str, dict[str, Any] | None] = {
    "none": None,
    "drop-oldest": {"rungs": ["drop"]},
    "mask": {"rungs": ["mask", "drop"]},
    "summarize-fast": {"rungs": ["summarize", "drop"], "summarizer": "fast"},
    "summarize-full": {"rungs": ["summarize", "drop"], "summarizer": "full"},
    "extractive": {"rungs": ["summarize", "drop"], "summarizer": "extractive"},
    # the shipped ladder before #24's second pass: bare placeholders, clearing to just under
    # the budget (the same run's baseline for the two knobs the default now sets)
    "default-before": {
        "rungs": LADDER, "summarizer": "fast", "clear_to_fraction": 1.0, "mask_digest_chars": 0,
    },
    # the ladder before #24's fourth pass: masking stopped once it left the room
    "default-mask": {"rungs": LADDER, "summarizer": "fast", "summarize_to_mark": False},
    # the shipped ladder until 2026-12-03: the fast tier writes the summary the rung asks for
    "default-fast": {"rungs": LADDER, "summarizer": "fast"},
    "default": {"rungs": LADDER, "summarizer": "extractive"},
}  # fmt: skip
REAL_MODELS = ("smollm2-135m", "smollm2-135m-fast")  # the embedded stack's served names
MOCK_WINDOW = MAX_MODEL_LEN  # bench.context_upstream's default window (8192)
CONTEXT_LENGTH = "maximum context length"  # in vLLM's 400 for a prompt over the window


@dataclass
class Session:
    messages: list[dict[str, Any]]  # the whole history before the questions
    starts: list[int]  # where each replayed request's history ends
    questions: list[Question]  # each asked after the whole history, one request apiece
    family: str = "seeded"


def replayed(history: list[dict[str, Any]], replay: int) -> list[int]:
    """Where the last ``replay`` agent steps' requests end (each before a tool call)."""
    return [len(history) - 2 * j for j in range(replay - 1, -1, -1)]


def stored_sessions(path: Path, count: int | None, replay: int) -> list[Session]:
    """The first ``count`` (all: None) sessions of ``path`` (bench.context_sessions)."""
    return [Session(s.messages, replayed(s.messages, replay), s.questions, s.family)
            for s in load(path)[:count]]  # fmt: skip


# the held-out shapes of a fact (--facts mixed): what key names it, the line that prints it
FACT_LINES = {
    "value": ("port_{i}", "port_{i} = {v}"),
    "error": ("job_{i}", "ERROR job_{i} failed: exit status {v}"),
    "path": ("run_{i}", "artifacts written under out/run_{i}/build-{v}.tar"),
    "ident": ("ticket_{i}", "ticket_{i} opened as #{v} for the on-call team"),
}


def build_session(
    rng: random.Random, steps: int, chars: int, replay: int, facts: str = "value"
) -> Session:
    task = "Find why the service on the staging host does not start, and fix it."
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    values, keys = [], []
    for i in range(steps):
        value = str(rng.randrange(10_000, 99_999))
        kind = rng.choice(sorted(FACT_LINES)) if facts == "mixed" else "value"
        key, line = (t.format(i=i, v=value) for t in FACT_LINES[kind])
        values.append(value)
        keys.append(key)
        lines = [f"$ inspect part_{i}", f"reading src/module_{i}.py", line]
        while sum(len(x) + 1 for x in lines) < chars:
            lines.append(
                f"INFO worker-{rng.randrange(1, 9)} processed batch {rng.randrange(1000)} in "
                f"{rng.randrange(5, 900)} ms; queue depth {rng.randrange(50)}"
            )
        call = {"id": f"call_{i}", "type": "function",
                "function": {"name": "run_shell", "arguments": f'{{"cmd": "inspect part_{i}"}}'}}  # fmt: skip
        msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "\n".join(lines)})
    k = rng.randrange(0, max(1, steps // 3))  # an early step: in the condensed part
    return Session(msgs, replayed(msgs, replay), [Question(keys[k], "number", values[k])])


def run_session(
    client: httpx.Client,
    name: str,
    n: int,
    s: Session,
    arm: Arm,
    tally: Tally,
    answers: list[dict[str, Any]] | None = None,
) -> None:
    """One session's replayed steps and questions through strategy ``name``'s key; each
    question is asked after the whole history, in a request of its own. ``answers`` gets
    each question's value, the model's text and its score (an error: text ``None``)."""
    headers = {"authorization": f"Bearer sk-{name}", "x-gearshift-context-budget": str(arm.budget),
               "x-session-id": f"{name}-{arm.budget}-{n}"}  # fmt: skip
    asks: list[tuple[list[dict[str, Any]], Question | None]] = [
        (s.messages[:end], None) for end in s.starts
    ]
    asks += [([*s.messages, {"role": "user", "content": q.text()}], q) for q in s.questions]
    tally.sessions += 1
    early: list[Score] = []
    end: list[Score] = []
    previous: list[int] | None = None  # the last step's prompt token ids
    for messages, q in asks:
        body = {"model": arm.model, "messages": messages, "temperature": 0,
                "max_tokens": 12 if q is None else 24,  # a path is longer than a number
                "return_token_ids": True}  # fmt: skip
        t0 = time.perf_counter()
        resp = client.post("/v1/chat/completions", json=body, headers=headers)
        took = (time.perf_counter() - t0) * 1000
        if resp.status_code != 200:
            tally.errors += 1
            tally.context_errors += context_length_error(resp)
            if q is not None:
                (end if q.end else early).append(Score(exact=False, normalised=False))
                if answers is not None:
                    answers.append(answer_record(q, None, Score(exact=False, normalised=False)))
            continue
        data = resp.json()
        tally.ms.append(took)
        tally.prompt_tokens.append(int(data["usage"]["prompt_tokens"]))
        ids = data.get("prompt_token_ids") or []
        if previous is not None and ids:  # a question against the last step, never another
            whole, share = extends(previous, ids)
            tally.extending.append(whole)
            tally.shared.append(share)
        if q is None:
            previous = ids or None
        count_summaries(name, resp.headers.get("x-gearshift-context", ""), tally)
        if q is not None:
            text = data["choices"][0]["message"].get("content") or ""
            if arm.show_answers:
                print(f"{name}\t{q.value}\t{text!r}", file=sys.stderr)
            tally.answer_ms.append(took)
            got = score(text, q.value, q.kind)
            (end if q.end else early).append(got)
            if answers is not None:
                answers.append(answer_record(q, text, got))
    tally.answered(s.family, early, end)


def context_length_error(resp: httpx.Response) -> bool:
    """A 400 for a prompt longer than the tier's window (vLLM's message, passed through)."""
    return resp.status_code == 400 and CONTEXT_LENGTH in resp.text


def answer_record(q: Question, text: str | None, got: Score) -> dict[str, Any]:
    return {"key": q.key, "kind": q.kind, "value": q.value, "end": q.end, "answer": text,
            "exact": got.exact, "normalised": got.normalised}  # fmt: skip


def count_summaries(name: str, done: str, tally: Tally) -> None:
    """A step's fresh summary (the answer's context header), and whether it fell back."""
    if any(f"summarizer={k}" in done for k in ("fast", "full", "extractive")):
        tally.summaries += 1
    strategy = STRATEGIES[name] or {}
    wanted = strategy.get("summarizer")
    # a ladder that masks may write an extractive summary on purpose (summarize_to_mark)
    on_purpose = "mask" in strategy.get("rungs", ()) and strategy.get("summarize_to_mark", True)
    if wanted in ("fast", "full") and not on_purpose and "summarizer=extractive" in done:
        tally.fallbacks += 1


@dataclass(frozen=True)
class Arm:
    budget: int
    model: str
    cache: PrefixCache | None  # the engines' prefix caches (the real stack only)
    show_answers: bool = False  # each answer to stderr: strategy, value, the model's text
    deadline: float = float("inf")  # time.monotonic(): no session starts after it
    first: int = 0  # the first session's index in the data (--skip)
    records: Path | None = None  # one JSON line per (session, strategy) appended as it ends


def run_arms(
    client: httpx.Client, names: list[str], sessions: list[Session], arm: Arm
) -> dict[str, list[Tally]]:
    """Every session through every strategy, the strategies alternating: session ``i``
    starts with the ``i``-th strategy, so no arm always runs first on a warm machine. On
    the real stack the prefix cache is emptied before each (session, strategy) so that an
    arm's hits are its own steps reusing their prefix, never another arm's prompt. No
    session starts after ``arm.deadline``: every arm has run the same sessions. Session
    ``i`` of ``sessions`` is the data's ``arm.first + i`` (its index names it: the order
    of arms, the session header, the record); with ``arm.records`` each (session,
    strategy) is appended there as it ends (bench.context_combine reads them). Returns
    each strategy's tallies, one per session run, in session order."""
    tallies: dict[str, list[Tally]] = {n: [] for n in names}
    for i, s in enumerate(sessions, start=arm.first):
        if time.monotonic() > arm.deadline:
            break
        k = i % len(names)
        for name in names[k:] + names[:k]:
            one, answers = Tally(), []
            t0 = time.perf_counter()
            if arm.cache is not None:
                arm.cache.reset()
                hits, queries = arm.cache.counters()
            run_session(client, name, i, s, arm, one, answers)
            if arm.cache is not None:
                h, q = arm.cache.counters()
                one.cache_hits += h - hits
                one.cache_queries += q - queries
            tallies[name].append(one)
            if arm.records is not None:
                record = {"budget": arm.budget, "session": i, "family": s.family,
                          "strategy": name, "seconds": round(time.perf_counter() - t0, 1),
                          "answers": answers, "tally": asdict(one)}  # fmt: skip
                with arm.records.open("ab") as out:
                    out.write(orjson.dumps(record) + b"\n")
    return tallies


def gateway_config(
    tmp: Path,
    full: str,
    fast: str,
    models: tuple[str, str],
    window: int,
    first_byte_s: float = 600,
) -> Path:
    keys, overrides = [], {}
    for name, strategy in STRATEGIES.items():
        digest = hashlib.sha256(f"sk-{name}".encode()).hexdigest()
        keys.append({"name": name, "tenant": "bench", "sha256": digest})
        overrides[name] = {"mode": "off"} if strategy is None else {"mode": "auto", **strategy}
    config = {
        "port": free_port(),
        "auth": {"mode": "keys", "keys": keys},
        "tiers": {
            "full": {"model": models[0], "replicas": [full]},
            "fast": {"model": models[1], "replicas": [fast]},
        },
        "store": {"enabled": False},
        "sandbox": {"enabled": False},
        "router": {"escalate": False},
        "timeouts": {"first_byte_s": first_byte_s, "between_chunks_s": 600},
        "context": {
            "window_tokens": {"full": window, "fast": window},
            "keys": overrides,
            "summary_timeout_s": 120,
        },
    }
    path = tmp / "gateway.yaml"
    path.write_bytes(orjson.dumps(config))  # JSON is YAML
    return path


@contextlib.contextmanager
def gateway(tmp: Path, config: Path) -> Iterator[str]:
    port = orjson.loads(config.read_bytes())["port"]
    log = tmp / "gateway.log"
    argv = [sys.executable, "-m", "gateway.cli.main", "--log-level", "warning", "serve",
            "--config", str(config)]  # fmt: skip
    proc = start(argv, log, cwd=ROOT)
    try:
        wait_http(f"http://127.0.0.1:{port}/ready", proc, log, timeout_s=300)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@contextlib.contextmanager
def upstreams(
    kind: str, tmp: Path, reader: str = "0.5b", window: int | None = None
) -> Iterator[tuple[str, str, tuple[str, str], int]]:
    """(full URL, fast URL, their model names, the window) of mock or real tiers;
    ``reader``: which of ``reader_model.READERS`` the ``reader`` kind serves; ``window``:
    the mock's or the reader's context window (None: the mock's 8192, the reader's own)."""
    if kind == "mock":
        port = free_port()
        log = tmp / "upstream.log"
        window = window or MOCK_WINDOW
        argv = [sys.executable, "-m", "bench.context_upstream", "--port", str(port),
                "--window", str(window)]  # fmt: skip
        proc = start(argv, log, cwd=ROOT)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(url + "/health", proc, log, timeout_s=60)
            yield url, url, ("mock-full", "mock-fast"), window
        finally:
            stop(proc)
        return
    if kind == "reader":  # one server as both tiers: the window holds a session whole
        model = reader_model.READERS[reader]
        # another window: the same folder served with another --max-model-len (an absent
        # folder: serving's own message, which names the reader by its READERS entry)
        if window is not None and (model.folder() / "config.json").exists():
            model = dataclasses.replace(model, window=window)
        with reader_model.serving(tmp, reader=model) as url:
            yield url, url, model.served_names, model.window
        return
    if window is not None:
        raise ValueError("--window: the mock's or the reader's, not the embedded stack's")
    off = {"GEARSHIFT_STORE__ENABLED": "false", "GEARSHIFT_SANDBOX__ENABLED": "false",
           # vLLM's POST /reset_prefix_cache: each arm's prefix-cache hits are its own
           "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
    print("starting the embedded stack (two vLLM servers)", flush=True)
    with serve(tmp / "serve.log", off) as stack:
        yield stack.full_url, stack.fast_url, REAL_MODELS, 4096


def print_table(rows: dict[str, dict[str, Any]]) -> None:
    print(f"{'strategy':<16}{'ms/step':>9}{'p95':>9}{'ms/ans':>8}{'tokens/step':>13}{'acc':>7}"
          f"{'ci95':>14}{'exact':>7}{'time_x':>8}{'tok_x':>9}{'acc_x':>7}{'cache':>7}"
          f"{'summ':>6}{'s/sess':>7}{'ext':>6}{'fallb':>6}{'err':>5}{'end':>6}")  # fmt: skip
    for n, r in rows.items():
        lo, hi = r["accuracy_ci95"]
        print(f"{n:<16}{r['ms_per_step']:>9}{r['p95_ms']:>9}{r['ms_per_answer']:>8}"
              f"{r['prompt_tokens_per_step']:>13}{r['accuracy']:>7}{f'{lo}-{hi}':>14}"
              f"{r['exact']:>7}{r.get('time_vs_none') or 0:>8}{r.get('tokens_vs_none') or 0:>9}"
              f"{r.get('accuracy_vs_none') or 0:>7}{r['prefix_cache_hit_rate'] or 0:>7}"
              f"{r['summaries']:>6}{r['summaries_per_session'] or 0:>7}"
              f"{r['extends_previous'] or 0:>6}{r['fallbacks']:>6}{r['errors']:>5}"
              f"{r['end_task'] if r['end_task'] is not None else '-':>6}")  # fmt: skip
    families = sorted({f for r in rows.values() for f in r["by_family"]})
    if len(families) > 1:  # the stored sessions' families: accuracy [95% interval]
        print(f"{'by family':<16}" + "".join(f"{f:>22}" for f in families))
        for n, r in rows.items():
            cells = [r["by_family"].get(f) for f in families]
            print(f"{n:<16}" + "".join(
                f"{c['accuracy']:>8} [{c['accuracy_ci95'][0]}-{c['accuracy_ci95'][1]}]".rjust(22)
                if c else f"{'-':>22}" for c in cells))  # fmt: skip


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4 seeded sessions on the mock: seconds")
    p.add_argument("--upstream", choices=("mock", "real", "reader"), default="mock",
                   help="reader: Qwen2.5-Coder (--reader) as both tiers (bench.reader_model)")  # fmt: skip
    p.add_argument("--reader", choices=tuple(reader_model.READERS), default="0.5b",
                   help="--upstream reader's model: Qwen2.5-Coder-0.5B or -1.5B-Instruct")  # fmt: skip
    p.add_argument("--data", type=Path, default=DATA,
                   help="the stored sessions (bench.context_sessions) replayed by default")  # fmt: skip
    p.add_argument("--seeded", action="store_true",
                   help="sessions generated from --seed (--steps, --fill, --facts) instead")  # fmt: skip
    p.add_argument("--sessions", type=int, default=None,
                   help="how many (stored: the first N, default all; seeded: default 40)")  # fmt: skip
    p.add_argument("--steps", type=int, default=12, help="tool steps per seeded session")
    p.add_argument("--replay", type=int, default=3, help="agent steps sent before the question")
    p.add_argument("--budget", default="0.5", help="share of the window; several: 0.15,0.5")
    p.add_argument("--fill", type=float, default=0.85,
                   help="a seeded session's history at the question, as a share of the window")  # fmt: skip
    p.add_argument(
        "--facts",
        choices=("value", "mixed"),
        default="value",
        help="seeded sessions' facts. value: a named value (port_3 = 41234); mixed (held "
        "out): an error, a path, an identifier's line or a named value",
    )
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--skip", type=int, default=0,
                   help="start at the data's session N (batch k of N: --skip kN --sessions N)")  # fmt: skip
    p.add_argument("--records", type=Path, default=None,
                   help="append one JSON line per (session, strategy) as it ends")  # fmt: skip
    p.add_argument("--window", type=int, default=None,
                   help="the tiers' context window in tokens (mock: 8192; reader: its own)")  # fmt: skip
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--show-answers", action="store_true", help="each answer to stderr")
    p.add_argument("--plot", type=Path, default=None,
                   help="tokens against accuracy per strategy, with 95%% intervals (PNG)")  # fmt: skip
    p.add_argument("--time-limit-s", type=float, default=float("inf"),
                   help="start no session after this long (the stack's start not counted)")  # fmt: skip
    args = p.parse_args()
    if args.skip < 0:
        p.error(f"--skip: a session index, 0 or more (got {args.skip})")
    if args.window is not None and args.window < 256:
        p.error(f"--window: tokens, 256 or more (got {args.window})")
    if args.window is not None and args.upstream == "real":
        p.error("--window: the mock's or the reader's (the embedded stack's is 4096)")
    if args.quick:
        args.sessions, args.upstream, args.seeded = 4, "mock", True
    if not args.seeded and not args.data.exists():
        print(f"{args.data} not found: seeded sessions instead", file=sys.stderr)
        args.seeded = True
    args.names = [n for n in args.strategies.split(",") if n]
    unknown = [n for n in args.names if n not in STRATEGIES]
    if unknown or "none" not in args.names:
        p.error(f"strategies are {', '.join(STRATEGIES)}, 'none' among them (got {unknown})")
    try:
        args.shares = [float(b) for b in args.budget.split(",") if b]
    except ValueError:
        p.error(f"--budget: shares of the window, comma-separated (got {args.budget!r})")
    if not args.shares or not all(0 < b <= 1 for b in args.shares):
        p.error(f"--budget: shares of the window in (0, 1] (got {args.budget!r})")
    return args


def sessions_for(args: argparse.Namespace, window: int) -> list[Session]:
    """The sessions to replay: the data's (or the seeded ones') ``--skip`` onwards,
    ``--sessions`` of them."""
    skip = args.skip
    if not args.seeded:
        count = None if args.sessions is None else skip + args.sessions
        return stored_sessions(args.data, count, args.replay)[skip:]
    rng = random.Random(args.seed)
    # the history at the question fills --fill of the window: it fits uncondensed
    chars = int(window * args.fill * 3.2 / args.steps)
    return [build_session(rng, args.steps, chars, args.replay, args.facts)
            for _ in range(skip + (args.sessions or 40))][skip:]  # fmt: skip


def main() -> None:
    args = parse_args()
    names, shares = args.names, args.shares
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tiers = upstreams(args.upstream, tmp, args.reader, args.window)
        with tiers as (full, fast, models, window):
            sessions = sessions_for(args, window)
            # the reader's whole-history prefill may outlast 600 s (the 1.5B on a shared core)
            first_byte_s = (reader_model.READERS[args.reader].first_byte_s
                            if args.upstream == "reader" else 600)  # fmt: skip
            config = gateway_config(tmp, full, fast, models, window, first_byte_s)
            timeout = max(900, first_byte_s + 60)  # the client outwaits the gateway
            with gateway(tmp, config) as url, httpx.Client(base_url=url, timeout=timeout) as client:
                # the full tier answers (the requests pin it); the fast one writes summaries
                cache = PrefixCache(client, [full]) if args.upstream != "mock" else None
                resets = cache.reset() if cache is not None else False
                by_budget, ran = {}, []
                for share in shares:  # the time limit split between the budgets
                    deadline = time.monotonic() + args.time_limit_s / len(shares)
                    arm = Arm(int(window * share), models[0], cache, args.show_answers, deadline,
                              args.skip, args.records)  # fmt: skip
                    per = run_arms(client, names, sessions, arm)
                    # a session fits when none got no context-length 400 on any request
                    fit = [t.context_errors == 0 for t in per["none"]]
                    entry = {"budget": arm.budget, **figures(per, fit, names)}
                    print(f"budget {arm.budget} tokens ({share} of the window)")
                    print_table(entry["strategies"])  # each budget's as it ends
                    print_split(entry)
                    sys.stdout.flush()
                    by_budget[str(share)] = entry
                    ran.append(len(fit))
    first = by_budget[str(shares[0])]
    if args.plot is not None:
        plot(first["strategies"], args.plot, f"{ran[0]} sessions, budget {first['budget']} tokens")
    source = (
        {"seed": args.seed, "facts": args.facts}
        if args.seeded
        else {
            "data": str(
                args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT) else args.data
            )
        }
    )
    print(orjson.dumps({
        "upstream": args.upstream, "sessions": ran[0], **source, "skip": args.skip,
        "window": window, **first,
        "prefix_cache_reset": resets, "by_budget": by_budget if len(shares) > 1 else None,
    }).decode())  # fmt: skip


def headline(rows: dict[str, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """The default strategy's figures (the last one asked for without it) against none."""
    default = rows.get("default", rows[names[-1]])
    return {
        "prompt_tokens_saved": round(1 - (default.get("tokens_vs_none") or 1), 3),
        "accuracy_vs_none": default.get("accuracy_vs_none"),
        "prefix_cache_hit_rate": default["prefix_cache_hit_rate"],
        "summaries_per_session": default["summaries_per_session"],
        "extends_previous": default["extends_previous"],
        "accuracy_vs_none_ci95": default.get("accuracy_vs_none_ci95"),
    }


HEADLINE_ON = "sessions that fit the window uncompressed (none: no context-length 400; #24)"


def merged(tallies: Iterable[Tally]) -> Tally:
    whole = Tally()
    for t in tallies:
        whole.merge(t)
    return whole


def figures(per: dict[str, list[Tally]], fit: list[bool], names: list[str]) -> dict[str, Any]:
    """One budget's figures from each strategy's tallies, one per session in session
    order, and whether each session fits (``fit``): ``strategies``, the rows over every
    session (as before the split); ``fitting`` and ``not_fitting``, the rows over the
    sessions that fit and over the others (None where there are none); ``headline``'s keys
    and ``accuracy_vs_none_ci95`` on the sessions that fit, issue #24's definition (where
    none fits: its ratios None); ``accuracy_not_fitting``, each strategy's accuracy on the
    others. Where every session fits, ``fitting`` is ``strategies`` and the headline is the
    one before the split."""

    def rows_of(keep: list[bool]) -> dict[str, dict[str, Any]]:
        tallies = {n: merged(t for t, k in zip(per[n], keep, strict=True) if k) for n in per}
        return {n: t.row(tallies["none"]) for n, t in tallies.items()}

    rows = rows_of([True] * len(fit))
    fitting = rows if all(fit) else rows_of(fit) if any(fit) else None
    not_fitting = None if all(fit) else rows_of([not f for f in fit])
    if fitting is not None:
        head = headline(fitting, names)
    else:  # no session to compare on: none answered nothing
        head = {**headline(rows, names), "prompt_tokens_saved": None, "accuracy_vs_none": None,
                "accuracy_vs_none_ci95": None}  # fmt: skip
    return {
        **head,
        "headline_on": HEADLINE_ON,
        "sessions_fitting": sum(fit),
        "sessions_not_fitting": len(fit) - sum(fit),
        "accuracy_not_fitting": (
            {n: r["accuracy"] for n, r in not_fitting.items()} if not_fitting else None
        ),
        "strategies": rows,
        "fitting": fitting,
        "not_fitting": not_fitting,
    }


def print_split(entry: dict[str, Any]) -> None:
    """The tables of the sessions that fit and of the others (where some do not fit), and
    the headline's line."""
    fits, others = entry["sessions_fitting"], entry["sessions_not_fitting"]
    if others and fits:
        print(f"sessions that fit the window uncompressed: {fits}")
        print_table(entry["fitting"])
        print(f"sessions that do not fit (none: a context-length 400): {others}")
        print_table(entry["not_fitting"])
    elif others:  # the table above is theirs
        print(f"sessions that do not fit (none: a context-length 400): all {others}")
    print(f"headline on the {fits} {HEADLINE_ON}: prompt_tokens_saved "
          f"{entry['prompt_tokens_saved']}, accuracy_vs_none {entry['accuracy_vs_none']} "
          f"ci95 {entry['accuracy_vs_none_ci95']}")  # fmt: skip


if __name__ == "__main__":
    main()
