"""One typed configuration for the whole gateway.

Sources, later ones winning: defaults, the YAML file given to ``--config``,
environment variables ``GEARSHIFT_<SECTION>__<FIELD>``. Every section forbids
unknown fields so that a typo fails at start-up with the field's name. This is
the only module that reads the environment. Secret settings may also come from files
(``store: {url_file: /run/secrets/store-url}``; gateway/secret_files.py).
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# the context sections live in gateway/config_context.py; re-exported here
from gateway.config_context import ContextOverride as ContextOverride
from gateway.config_context import ContextSettings as ContextSettings
from gateway.config_section import Section
from gateway.secret_files import SecretFileError, resolve, top_level_from_environment
from router.types import Tier
from sandbox.config import SandboxConfig


class TierSettings(Section):
    """One tier: the model name clients use and the vLLM replicas that serve it."""

    model: str = Field(description="model name served by the replicas and shown in /v1/models")
    replicas: list[str] = Field(
        default_factory=list, description="base URLs, e.g. http://127.0.0.1:8101"
    )
    fallback: bool = Field(
        default=True, description="serve from the other tier when this one is down"
    )
    tool_call_parser: str | None = Field(
        default=None, description="the replicas' --tool-call-parser; must match across tiers"
    )
    family_check: Literal["required", "warn"] = Field(
        default="required",
        description="at start-up, a failed same-family check (its /tokenize) that concerns this "
        "tier stops `serve` (required) or is logged as a warning (warn: e.g. a replica behind "
        "a proxy that does not pass /tokenize)",
    )

    @field_validator("replicas")
    @classmethod
    def _urls(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"replica URL {url!r} must start with http:// or https://")
        return [url.rstrip("/") for url in value]


class TimeoutSettings(Section):
    connect_s: float = Field(default=3.0, gt=0)
    first_byte_s: float = Field(
        default=300.0, gt=0, description="until headers and first chunk (non-stream: whole body)"
    )
    between_chunks_s: float = Field(default=60.0, gt=0)
    client_idle_s: int = Field(
        default=75,
        ge=1,
        description="an idle keep-alive client connection stays open this long; longer than "
        "client pools keep theirs (httpx 5 s, aiohttp 15 s), so the client closes first",
    )


class RetrySettings(Section):
    attempts: int = Field(default=3, ge=1, le=10)
    backoff_base_s: float = Field(default=0.1, ge=0)
    backoff_max_s: float = Field(default=2.0, ge=0)
    max_retry_after_s: float = Field(
        default=10.0, ge=0, description="longer Retry-After answers go to the client"
    )


class HealthSettings(Section):
    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=2.0, gt=0)
    unhealthy_after: int = Field(
        default=2, ge=1, description="consecutive failed checks that eject a replica"
    )


class BreakerSettings(Section):
    failure_threshold: int = Field(
        default=5, ge=1, description="consecutive failures that open the circuit"
    )
    reset_after_s: float = Field(
        default=10.0, gt=0, description="open time before one trial request"
    )


class ApiKey(Section):
    name: str
    tenant: str
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the key; see `gearshift keys new`"
    )
    admin: bool = Field(default=False, description="may use the admin API (/admin/v1)")
    models: list[str] | None = Field(
        default=None, description="model names it may request (auto, full, fast, a tier's model)"
    )
    tools: list[str] | None = Field(default=None, description="hosted tools it may run")


class AuthSettings(Section):
    mode: Literal["keys", "none"] = "none"  # refused on non-loopback hosts; see Settings
    keys: list[ApiKey] = Field(default_factory=list)
    refresh_s: float = Field(
        default=0.5,
        gt=0,
        le=60,
        description="how often each replica checks the store for changed keys and limits "
        "(a revoked key is refused within about this long)",
    )


# session -> rules (forced tool calls, high effort, failed tool call) -> the trained classifier;
# code and math rules off: on this model family they cost 0.14 APGR (docs/decisions/); forced
# tool calls go full: the pruned tier's agree with full's 0.44 of the time (tool_call, on by default)
DEFAULT_ROUTER_PARAMS: dict[str, Any] = {
    "base": "rules",
    "base_params": {"base": "classifier", "code": False, "math": False},
}


class RouterSettings(Section):
    policy: str = Field(default="session", description="routing policy (docs/router.md)")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="the policy's parameters; for the default 'session' policy without "
        "params, the default chain (DEFAULT_ROUTER_PARAMS); given, they replace it as a whole",
    )
    escalate: bool = Field(
        default=True,
        description="re-run a routed fast-tier answer on the full tier when it fails validation "
        "(invalid tool call, missing forced tool call, cut by the token limit)",
    )
    max_sessions: int = Field(
        default=100_000, gt=0, description="sessions whose routing history is kept (LRU)"
    )
    session_ttl_s: float = Field(
        default=3600.0, gt=0, description="a session's routing history expires after this idle time"
    )
    recall: bool = Field(
        default=False,
        description="with several replicas on one store: rebuild a session's routing history "
        "from its recorded steps when a step continues an answer this replica did not give "
        "(gateway.routing.recall; docs/deployment.md). Off for one replica: a client that "
        "edits the answers it echoes would cost a store read per step",
    )
    recall_wait_s: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="with several replicas: how long a step that continues an answer another "
        "replica gave waits for that step to be recorded, to rebuild the session's routing "
        "history from the store (gateway.routing.recall; docs/deployment.md); 0: no wait",
    )
    calibrate_tokens: bool = Field(
        default=True,
        description="check the router's prompt-token estimate against the full tier's tokenizer "
        "and chat template through its /tokenize once it answers, then refit it to the tiers' own "
        "counts of the prompts they serve (router.tokens; docs/router.md)",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_chain(cls, data: Any) -> Any:
        """The default chain's params apply only to the default policy: choosing another
        policy without params gives that policy its own defaults."""
        default_policy = isinstance(data, dict) and data.get("policy", "session") == "session"
        if default_policy and "params" not in data:
            return {**data, "params": dict(DEFAULT_ROUTER_PARAMS)}
        return data


class LimitsSettings(Section):
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    reserve_max_tokens: int = Field(
        default=4096,
        ge=1,
        description="completion tokens a budget reserves for a request that sets no max_tokens",
    )
    lease_s: float = Field(
        default=30.0,
        ge=2.0,
        le=3600.0,
        description="how long budget a replica leased outlives its last store transaction: a "
        "replica that dies under-admits by what it held for at most this long",
    )
    flush_s: float = Field(
        default=0.5,
        gt=0.0,
        le=60.0,
        description="how often a replica writes settled usage to the store (how stale the "
        "other replicas' view of it can be)",
    )

    @model_validator(mode="after")
    def _flush_within_lease(self) -> LimitsSettings:
        if self.flush_s * 8 > self.lease_s:
            raise ValueError("limits.flush_s must be at most an eighth of limits.lease_s")
        return self


class TelemetrySettings(Section):
    exporter: Literal["none", "otlp", "console"] = "none"
    otlp_endpoint: str | None = None
    service_name: str = "gearshift"
    scrape_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="how often replicas' /metrics are scraped (spec decoding, queues)",
    )


class StoreSettings(Section):
    """The trajectory store and its recorder (docs/trajectories.md)."""

    enabled: bool = Field(default=True, description="record every step (token ids, logprobs, ...)")
    url: str = Field(
        default_factory=lambda: (
            "sqlite:///"
            + str(Path(os.environ.get("GEARSHIFT_HOME", "~/.cache/gearshift")).expanduser())
            + "/trajectories.db"
        ),
        description="SQLAlchemy URL: sqlite:///PATH (default) or postgresql://user:pw@host/db",
    )
    migrate: bool = Field(
        default=True, description="run `alembic upgrade head` at start-up (off: refuse if behind)"
    )
    queue_size: int = Field(default=10_000, ge=1, description="steps held in memory before on_full")
    queue_mb: int = Field(
        default=512,
        ge=1,
        description="megabytes of encoded steps held in memory before on_full (an agent step "
        "with its history and prompt token ids is about 0.1 MB)",
    )
    batch_size: int = Field(
        default=256, ge=1, description="most steps committed in one transaction"
    )
    batch_mb: float = Field(
        default=4.0,
        gt=0,
        description="about the most megabytes of encoded steps in one transaction (one "
        "writer frame, built on the event loop: 256 agent steps are ~25 MB)",
    )
    linger_s: float = Field(
        default=0.05,
        ge=0,
        le=5,
        description="how long a batch waits for more steps before it commits: fewer, larger "
        "transactions under load, at most this much later durability",
    )
    writer_cpus: list[int] | None = Field(
        default=None,
        description="CPUs for the writer process (default: the gateway's); give it a core "
        "of its own when the gateway's is busy",
    )
    writer_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="scheduling niceness of the writer process: on a busy core requests run "
        "first and the queue absorbs the delay",
    )
    writer_idle: bool = Field(
        default=True,
        description="run the writer at idle priority (SCHED_IDLE) while it is served: on a "
        "core it shares with the gateway it never delays a request; a writer starved there "
        "(the core kept busy) is brought back to writer_nice for a cool-down "
        "(gearshift_recorder_writer_starved_total); needs CAP_SYS_NICE, else writer_nice",
    )
    on_full: Literal["wait", "drop"] = Field(
        default="wait",
        description="wait: hold the request up to wait_s for room, then drop; drop: drop at once. "
        "Drops are counted in gearshift_recorder_dropped_total and logged",
    )
    wait_s: float = Field(default=1.0, ge=0)
    dead_letter_path: str = Field(
        default_factory=lambda: str(
            Path(os.environ.get("GEARSHIFT_HOME", "~/.cache/gearshift")).expanduser()
            / "recorder-dead-letter.jsonl"
        ),
        description="steps the database refused, as JSON lines, for replay",
    )


class RewardSettings(Section):
    weights: dict[str, float] | None = Field(
        default=None,
        description="weight per reward component for the combined reward; default in "
        "gateway/recording/rewards.py",
    )
    hooks: list[str] = Field(
        default_factory=list, description="'module:function' reward hooks called per step"
    )


class McpServerSettings(Section):
    """One MCP server the operator allows (docs/responses.md, "MCP tools")."""

    label: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="its server_label; a request may name a stdio server by label alone",
    )
    url: str | None = Field(
        default=None, description="streamable HTTP endpoint, e.g. https://mcp.example.com/mcp"
    )
    command: list[str] | None = Field(
        default=None, min_length=1, description="a stdio server: the command the gateway starts"
    )
    env: dict[str, str] = Field(default_factory=dict, description="a stdio server's environment")
    tenants: list[str] = Field(
        min_length=1, description="tenants that may use it; '*' for every tenant"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"MCP server url {value!r} must start with http:// or https://")
        return None if value is None else value.rstrip("/")

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerSettings:
        if (self.url is None) == (self.command is None):
            raise ValueError(f"MCP server {self.label!r}: give exactly one of url and command")
        return self


class McpSettings(Section):
    """MCP tools of ``/v1/responses``: deny by default, like the sandbox's egress."""

    servers: list[McpServerSettings] = Field(
        default_factory=list, description="the allowlist: servers tenants' requests may use"
    )
    timeout_s: float = Field(
        default=30.0, gt=0, description="one MCP operation (connect and list, or one call)"
    )


class ResponsesCaps(Section):
    """One tenant's caps on the hosted loop; a field left unset keeps the default."""

    max_turns: int | None = Field(default=None, ge=1, le=256)
    max_tool_calls: int | None = Field(default=None, ge=0, le=100_000)
    max_wall_s: float | None = Field(default=None, gt=0, le=86_400)
    max_total_tokens: int | None = Field(default=None, ge=1, le=100_000_000)
    max_background: int | None = Field(default=None, ge=0, le=100_000)


@dataclass(frozen=True, slots=True)
class LoopCaps:
    """The caps on one tenant's responses (``ResponsesSettings.caps``); None: no cap."""

    max_turns: int
    max_tool_calls: int | None
    max_wall_s: float | None
    max_total_tokens: int | None


class ResponsesSettings(Section):
    """``/v1/responses`` (docs/responses.md)."""

    max_turns: int = Field(
        default=8,
        ge=1,
        le=256,
        description="model steps one response may run (the hosted tool loop); reaching it ends "
        "the response incomplete with reason 'max_turns'",
    )
    max_tool_calls: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="hosted tool calls one response may run (null: no cap); a request's "
        "max_tool_calls can only lower it; reaching it ends the response incomplete with "
        "reason 'max_tool_calls'",
    )
    max_wall_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="seconds one response's loop may run (null: no cap); a model step still "
        "running then is stopped, and no step starts after it: the response ends incomplete "
        "with reason 'max_wall_s' (a hosted call running then finishes first, within its own "
        "timeout)",
    )
    max_total_tokens: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="input + output tokens of all the model steps of one response (null: no "
        "cap); each step's max_tokens is at most what is left; reaching it ends the response "
        "incomplete with reason 'max_total_tokens'",
    )
    max_background: int = Field(
        default=16,
        ge=0,
        le=100_000,
        description="background responses one tenant may have running on one gateway replica; "
        "a create over it is a 429 that stores nothing (0: no background responses)",
    )
    tenants: dict[str, ResponsesCaps] = Field(
        default_factory=dict,
        description="per-tenant caps ({tenant: {max_turns, max_tool_calls, max_wall_s, "
        "max_total_tokens, max_background}}) replacing the defaults above for that tenant",
    )
    sandbox_cache_s: float = Field(
        default=1.0,
        ge=0,
        le=60,
        description="how long the sandbox's tool listing and a key's tools held for approval "
        "are reused by the next requests with hosted tools (0: ask on every request)",
    )
    mcp: McpSettings = McpSettings()

    def caps(self, tenant: str) -> LoopCaps:
        """The caps of a tenant's responses: its own (``tenants``), else the defaults."""
        own = self.tenants.get(tenant, ResponsesCaps())
        return LoopCaps(
            own.max_turns if own.max_turns is not None else self.max_turns,
            own.max_tool_calls if own.max_tool_calls is not None else self.max_tool_calls,
            own.max_wall_s if own.max_wall_s is not None else self.max_wall_s,
            own.max_total_tokens if own.max_total_tokens is not None else self.max_total_tokens,
        )

    def background_cap(self, tenant: str) -> int:
        """How many background responses ``tenant`` may have running on one replica."""
        own = self.tenants.get(tenant, ResponsesCaps()).max_background
        return self.max_background if own is None else own


class KVCompactionTier(Section):
    """KV-cache compaction on one embedded vLLM server (docs/kv-compaction.md)."""

    enabled: bool = False
    trigger_tokens: int = Field(
        default=2048, ge=1, description="only a request whose prompt is longer than this"
    )
    trigger: Literal["prompt", "watermark"] = Field(
        default="prompt",
        description="compact when the prompt is prefilled, or when KV usage reaches "
        "high_watermark (running requests, longest first, until under low_watermark)",
    )
    high_watermark: float = Field(default=0.9, gt=0, le=1, description="KV usage, 0..1")
    low_watermark: float = Field(default=0.7, gt=0, lt=1, description="KV usage, 0..1")
    budget: float = Field(
        default=0.5,
        gt=0,
        description="tokens kept: a fraction of the prompt (<= 1) or a whole number of tokens",
    )
    window: int = Field(
        default=32, ge=1, description="the last prompt tokens whose queries score the rest"
    )
    sinks: int = Field(default=4, ge=0, description="first tokens always kept")
    per_head: bool = Field(default=False, description="one selection per KV head")

    @model_validator(mode="after")
    def _check_budget(self) -> KVCompactionTier:
        if self.budget > 1 and (
            self.budget != int(self.budget) or self.budget < self.sinks + self.window
        ):
            raise ValueError(
                f"kv_compaction.budget ({self.budget}) must be a fraction <= 1 or a whole "
                f"number of tokens >= sinks + window ({self.sinks + self.window})"
            )
        if self.low_watermark >= self.high_watermark:
            raise ValueError(
                f"kv_compaction.low_watermark ({self.low_watermark}) must be below "
                f"high_watermark ({self.high_watermark})"
            )
        return self


class KVCompactionSettings(Section):
    """Per tier: the full and the fast server (off by default)."""

    full: KVCompactionTier = KVCompactionTier()
    fast: KVCompactionTier = KVCompactionTier()


# The embedded settings that only shape the fast tier (and kv_compaction.fast).
FAST_TIER_FIELDS = frozenset(
    {
        "fast_mode", "prune_remove", "prune_method", "heal_steps", "heal_data", "heal_samples",
        "speculative_tokens", "ngram_min", "ngram_max",
    }
)  # fmt: skip


class EmbeddedSettings(Section):
    """The embedded default stack started by ``gearshift serve`` without replicas."""

    home: Path = Field(
        default_factory=lambda: Path(
            os.environ.get("GEARSHIFT_HOME", "~/.cache/gearshift")
        ).expanduser()
    )
    vllm_python: Path | None = Field(
        default=None,
        description="python of the vLLM virtualenv; default <home>/vllm-venv/bin/python",
    )
    layout: Literal["routed", "full-replicas"] = Field(
        default="routed",
        description="routed: the full model on one core, the fast tier on the other, "
        "model 'auto' routed between them; full-replicas: the full model on each core, both "
        "replicas of the full tier, no fast tier (the throughput choice on a CPU host: "
        "docs/embedded-stack.md)",
    )
    full_port: int = Field(default=8101, gt=0, lt=65536)
    fast_port: int = Field(
        default=8102,
        gt=0,
        lt=65536,
        description="the second server's: the fast tier's, or the second full replica's",
    )
    max_model_len: int = Field(default=4096, ge=256)
    kv_cache_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    startup_timeout_s: float = Field(default=600.0, gt=0)
    max_restarts: int = Field(
        default=3, ge=0, description="restarts of a dead vLLM server before it is reported failed"
    )
    fast_mode: Literal["lossy", "lossless", "ngram", "suffix"] = Field(
        default="lossy",
        description="lossy: the pruned model serves (ngram speculation); lossless: the full model "
        "serves with the pruned one as its draft; ngram: the full model with ngram speculation; "
        "suffix: the full model with suffix decoding (needs arctic-inference in the vLLM "
        "environment: scripts/install.sh --with-suffix; docs/fast-tier.md)",
    )
    prune_remove: int = Field(
        default=4, ge=1, description="decoder layers removed for the fast tier"
    )
    prune_method: Literal["block-influence", "angular"] = "block-influence"
    dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16",
        description="weights and activations of both servers; float32 doubles the KV budget "
        "and makes greedy decoding agree across speculative and plain decoding (docs/fast-tier.md)",
    )
    heal_steps: int = Field(default=400, ge=0, description="distillation steps after pruning")
    heal_data: Literal["calibration", "self"] = Field(
        default="self",
        description="what healing distils on: the calibration text, or conversations the full "
        "model writes itself (docs/fast-tier.md)",
    )
    heal_samples: int = Field(
        default=256, ge=4, le=20000, description="conversations written for heal_data: self"
    )
    speculative_tokens: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="tokens proposed per decoding step; default 6 for the lossy mode's ngram "
        "speculation, 4 for the ngram mode's, 3 for the lossless mode's draft model, 16 for "
        "the suffix mode's suffix tree",
    )
    ngram_min: int = Field(default=2, ge=1, description="shortest prompt n-gram matched to draft")
    ngram_max: int = Field(default=4, ge=1, description="longest prompt n-gram matched to draft")
    kv_compaction: KVCompactionSettings = KVCompactionSettings()

    @model_validator(mode="after")
    def _check_ngram(self) -> EmbeddedSettings:
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"embedded.ngram_min ({self.ngram_min}) must not exceed "
                f"embedded.ngram_max ({self.ngram_max})"
            )
        return self

    @model_validator(mode="after")
    def _check_layout(self) -> EmbeddedSettings:
        # A fast-tier setting changed from its default would silently do nothing and mislead
        # whoever tunes it; defaults pass (the annotated example file lists every field).
        fields = type(self).model_fields
        unused = [f for f in sorted(FAST_TIER_FIELDS) if getattr(self, f) != fields[f].default]
        if self.kv_compaction.fast.enabled:  # both replicas take kv_compaction.full
            unused.append("kv_compaction.fast")
        if self.layout == "full-replicas" and unused:
            names = ", ".join(f"embedded.{name}" for name in unused)
            raise ValueError(
                f"{names}: {'it shapes' if len(unused) == 1 else 'they shape'} the fast tier, "
                "which embedded.layout 'full-replicas' does not run; leave the default or use "
                "layout 'routed'"
            )
        return self

    @property
    def python(self) -> Path:
        return self.vllm_python or self.home / "vllm-venv" / "bin" / "python"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GEARSHIFT_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, lt=65536)
    tiers: dict[Tier, TierSettings] = Field(default_factory=dict)
    timeouts: TimeoutSettings = TimeoutSettings()
    retries: RetrySettings = RetrySettings()
    health: HealthSettings = HealthSettings()
    breaker: BreakerSettings = BreakerSettings()
    auth: AuthSettings = AuthSettings()
    router: RouterSettings = RouterSettings()
    limits: LimitsSettings = LimitsSettings()
    telemetry: TelemetrySettings = TelemetrySettings()
    embedded: EmbeddedSettings = EmbeddedSettings()
    store: StoreSettings = StoreSettings()
    sandbox: SandboxConfig = SandboxConfig()
    rewards: RewardSettings = RewardSettings()
    responses: ResponsesSettings = ResponsesSettings()
    context: ContextSettings = ContextSettings()
    admin_token: SecretStr | None = None

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.auth.mode == "none" and not _is_loopback(self.host):
            raise ValueError(
                f"auth.mode 'none' is only allowed on a loopback host, not {self.host!r}; "
                "configure auth.keys or bind to 127.0.0.1"
            )
        if self.auth.mode == "keys" and not self.auth.keys and not self.store.enabled:
            raise ValueError(
                "auth.mode is 'keys' but auth.keys is empty and the store (where "
                "`gearshift keys create` puts keys) is off; add keys or set auth.mode: none"
            )
        models = [t.model for t in self.tiers.values()]
        if len(set(models)) != len(models):
            raise ValueError(f"tier model names must differ, got {models}")
        if "auto" in models:
            raise ValueError("'auto' is reserved for routed requests and cannot name a tier")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment overrides the file, the file overrides defaults; both may name secret files.
        return (
            _SecretFiles(settings_cls, env_settings, os.environ),
            _SecretFiles(settings_cls, init_settings),
        )


class _SecretFiles(PydanticBaseSettingsSource):
    """Another source's values with every secret file read (gateway/secret_files.py)."""

    def __init__(
        self,
        settings_cls: type[BaseSettings],
        inner: PydanticBaseSettingsSource,
        environ: Any = None,
    ) -> None:
        super().__init__(settings_cls)
        self._inner, self._environ = inner, environ

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ asks the inner source

    def __call__(self) -> dict[str, Any]:
        data = resolve(self._inner())
        if self._environ is not None:
            data |= top_level_from_environment("GEARSHIFT_", self._environ)
        return data


class ConfigError(Exception):
    """The configuration file is missing, unreadable or invalid."""


def load_settings(path: Path | None = None, **overrides: Any) -> Settings:
    """Read the YAML file at ``path`` (if any), apply ``overrides``, then the environment."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data.update(loaded or {})
    data.update(overrides)
    try:
        return Settings(**data)
    except SecretFileError as exc:
        raise ConfigError(str(exc)) from None
