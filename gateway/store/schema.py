"""The trajectory store's tables (SQLAlchemy Core; one metadata for SQLite and PostgreSQL).

Entities, from the outside in::

    tenants ─< sessions ─< steps ─< tool_calls
                  │          └─< rewards (scope step / tool_call)
                  ├─< rewards (scope session)
                  ├─< context_events (condensations of its context; ``gateway.recording.context_event``)
                  └─< feedback
    blobs: content-addressed request payloads (messages, prompt, tools), shared by steps
    responses ─< response_items: the Responses API's stored state (``gateway.store.responses``)
    tenants ─< api_keys, limits, usage_windows, usage_leases; access_changes: keys and
    budgets (``gateway.store.keys``, ``gateway.store.ledger``)

A session is an episode (one agent trajectory). A step is one model call and one
choice of it: its exact prompt and completion token ids and per-token behaviour
log-probabilities are stored as packed little-endian arrays (see ``codec``), which is
what an importance-sampling RL run needs and what re-tokenizing text cannot give back; a
prompt as a reference to an earlier step's ids plus its own new ones (``prompt_refs``).
Every row carries ``tenant_id`` so that each query can be scoped to one tenant
without a join.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

ID = 32  # hex uuid4 / truncated sha256

tenants = Table(
    "tenants",
    metadata,
    Column("id", String(128), primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", String(ID), primary_key=True),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column("api_key", String(128), nullable=False),
    Column("external_id", String(256), comment="X-Session-Id or the request's `user`"),
    Column("task_id", String(256)),
    Column("group_id", String(256), comment="GRPO group: sessions sampled for one task"),
    Column("task_spec", JSON, comment="expected actions for API-correctness rewards"),
    Column("status", String(16), nullable=False, comment="open | ended"),
    Column("outcome", String(64)),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True)),
    UniqueConstraint("tenant_id", "external_id"),
    Index("ix_sessions_tenant_created", "tenant_id", "created_at"),
)

blobs = Table(
    "blobs",
    metadata,
    Column("sha256", String(64), primary_key=True),
    Column("body", LargeBinary, nullable=False, comment="JSON, as the client sent it"),
)

# ``steps.policy`` of a context summarizer's own model call (recorded by the context ladder,
# left out of exports and router training unless asked for)
SUMMARY_POLICY = "context-summary"

steps = Table(
    "steps",
    metadata,
    Column("id", String(ID), primary_key=True),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column("session_id", String(ID), ForeignKey("sessions.id"), nullable=False),
    Column("seq", Integer, nullable=False, comment="order within the session"),
    Column("choice_index", Integer, nullable=False),
    Column("request_id", String(64), nullable=False),
    Column("endpoint", String(16), nullable=False),
    Column("request_sha256", String(64), ForeignKey("blobs.sha256"), nullable=False),
    Column("response", JSON, comment="the assistant message (or completion text) of this choice"),
    Column(
        "prompt_token_ids",
        LargeBinary,
        comment="int32 LE: the prompt's ids after the prompt_ref_len it shares (store.prompt_refs)",
    ),
    Column(
        "prompt_ref_step",
        String(ID),
        comment="earlier step of the session whose prompt + completion this prompt extends",
    ),
    Column("prompt_ref_len", Integer, comment="ids shared with prompt_ref_step's"),
    Column("completion_token_ids", LargeBinary, comment="int32 LE"),
    Column("logprobs", LargeBinary, comment="float32 LE, one per completion token"),
    Column("tier", String(8)),
    Column("model", String(256), comment="served model name: the model version"),
    Column("replica", String(256)),
    Column("policy", String(64)),
    Column("propensity", Float, comment="probability the policy gave the chosen tier"),
    Column("route_reason", Text),
    Column("features", JSON),
    Column("fallback", Boolean, nullable=False),
    Column("escalated", Boolean, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("status", Integer, nullable=False, comment="HTTP status given to the client"),
    Column("finish_reason", String(32)),
    Column("prompt_tokens", Integer),
    Column("completion_tokens", Integer),
    Column("ttft_ms", Float),
    Column("duration_ms", Float, nullable=False),
    Column("error", Text),
    Column("rewritten", Boolean, nullable=False, comment="history does not extend the last step"),
    Column("prefix_sha256", String(64), comment="hash of the history this step continued"),
    Column("continuation_sha256", String(64), comment="hash of history + this answer"),
    Column("routing_version", String(ID), comment="the routing version that decided the tier"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_steps_session_seq", "session_id", "seq", "choice_index", unique=True),
    Index("ix_steps_tenant_created", "tenant_id", "created_at"),
    Index("ix_steps_tenant_continuation", "tenant_id", "continuation_sha256"),
)

tool_calls = Table(
    "tool_calls",
    metadata,
    Column("id", String(ID), primary_key=True),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column("session_id", String(ID), ForeignKey("sessions.id"), nullable=False),
    Column("step_id", String(ID), ForeignKey("steps.id"), nullable=False),
    Column("call_id", String(128), comment="the model's tool_call id"),
    Column("tool", String(256), nullable=False),
    Column("arguments", Text, nullable=False),
    Column("arguments_valid", Boolean, nullable=False, comment="JSON object matching the schema"),
    Column("result", Text),
    Column("result_step_id", String(ID), comment="the step whose request carried the result"),
    Column("status", String(16), nullable=False, comment="pending | ok | error | denied"),
    Column("exit_status", Integer),
    Column("duration_ms", Float),
    Column("denial", Text),
    Column("injected_fault", String(64)),
    Column("attestation", String(64), comment="sandbox SHA-256 over request and result"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_tool_calls_session_call", "session_id", "call_id"),
)

rewards = Table(
    "rewards",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column("session_id", String(ID), ForeignKey("sessions.id"), nullable=False),
    Column("step_id", String(ID), ForeignKey("steps.id")),
    Column("tool_call_id", String(ID), ForeignKey("tool_calls.id")),
    Column("scope", String(16), nullable=False, comment="session | step | tool_call"),
    Column("name", String(64), nullable=False),
    Column("value", Float, nullable=False),
    Column("source", String(32), nullable=False, comment="gateway | feedback | client | hook"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_rewards_session", "session_id"),
)

feedback = Table(
    "feedback",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column("session_id", String(ID), ForeignKey("sessions.id"), nullable=False),
    Column("step_id", String(ID), ForeignKey("steps.id")),
    Column("score", Float, nullable=False),
    Column("label", String(64)),
    Column("comment", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_feedback_session", "session_id"),
)

responses = Table(
    "responses",
    metadata,
    Column("id", String(64), primary_key=True, comment="resp_..."),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column(
        "session",
        String(256),
        nullable=False,
        comment="the trajectory session's name: X-Session-Id, else the chain's first response id",
    ),
    Column("previous_response_id", String(64), comment="no foreign key: a parent may be deleted"),
    Column("status", String(16), nullable=False, comment="completed | incomplete | failed"),
    Column("model", String(256)),
    Column("body", JSON, nullable=False, comment="the response object as the client got it"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_responses_tenant_created", "tenant_id", "created_at"),
)

response_items = Table(
    "response_items",
    metadata,
    Column("response_id", String(64), ForeignKey("responses.id"), primary_key=True),
    Column("seq", Integer, primary_key=True, autoincrement=False, comment="inputs, then outputs"),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column("role", String(8), nullable=False, comment="input | output"),
    Column("item_id", String(64), nullable=False),
    Column("item", JSON, nullable=False, comment="the item as the API lists it"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(ID), primary_key=True, comment="key_...: how admins name a key"),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column("name", String(128), nullable=False, comment="recorded as the steps' api_key"),
    Column("sha256", String(64), nullable=False, unique=True, comment="hex SHA-256 of the key"),
    Column("prefix", String(16), nullable=False, comment="the key's first characters, to tell"),
    Column("admin", Boolean, nullable=False),
    Column("models", JSON, comment="model names it may request; null: all"),
    Column("tools", JSON, comment="hosted tools it may run; null: all"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True)),
    Column("revoked_at", DateTime(timezone=True)),
    Column("rotated_to", String(ID), comment="the key that replaced this one"),
    Index("ix_api_keys_tenant_name", "tenant_id", "name"),
)

limits = Table(
    "limits",
    metadata,
    Column("tenant_id", String(128), ForeignKey("tenants.id"), primary_key=True),
    Column("key_name", String(128), primary_key=True, comment="'': the whole tenant"),
    Column("requests_per_minute", Integer),
    Column("tokens_per_minute", Integer),
    Column("tokens_per_day", BigInteger),
    Column("tokens_per_month", BigInteger),
    Column("soft_percent", Integer, nullable=False, comment="warn from this share of a budget"),
)

usage_windows = Table(
    "usage_windows",
    metadata,
    Column("tenant_id", String(128), primary_key=True),
    Column("key_name", String(128), primary_key=True, comment="'': the whole tenant"),
    Column("window", String(16), primary_key=True, comment="UTC minute, day or month"),
    Column("unit", String(8), primary_key=True, comment="requests | tokens"),
    Column("used", BigInteger, nullable=False, comment="settled"),
    Column("reserved", BigInteger, nullable=False, comment="admitted, not yet settled"),
)

usage_leases = Table(
    "usage_leases",
    metadata,
    Column("tenant_id", String(128), primary_key=True),
    Column("key_name", String(128), primary_key=True),
    Column("window", String(16), primary_key=True),
    Column("unit", String(8), primary_key=True),
    Column("holder", String(64), primary_key=True, comment="the replica: host:pid:random"),
    Column(
        "amount",
        BigInteger,
        nullable=False,
        comment="part of the counter's reserved that is this replica's",
    ),
    Column(
        "expires_ms", BigInteger, nullable=False, comment="Unix ms; renewed while the replica lives"
    ),
)

access_changes = Table(
    "access_changes",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("version", BigInteger, nullable=False, comment="bumped by every key or limit change"),
)

# -- the control plane: routing versions and kill switches (gateway.store.control) ----------

routing_versions = Table(
    "routing_versions",
    metadata,
    Column("id", String(ID), primary_key=True, comment="sha256 of the canonical config, 16 hex"),
    Column("config", JSON, nullable=False, comment="{policy, params}"),
    Column("note", Text),
    Column("created_by", String(128), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

routing_events = Table(
    "routing_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "action", String(16), nullable=False, comment="publish | rollback | canary | canary_off"
    ),
    Column(
        "published",
        String(ID),
        ForeignKey("routing_versions.id"),
        nullable=False,
        comment="the published version after this event",
    ),
    Column(
        "canary",
        String(ID),
        ForeignKey("routing_versions.id"),
        comment="the canary version after this event",
    ),
    Column("canary_weight", Float, nullable=False, comment="share of sessions on the canary"),
    Column("actor", String(128), nullable=False),
    Column("note", Text),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

kill_switches = Table(
    "kill_switches",
    metadata,
    Column(
        "kind",
        String(16),
        primary_key=True,
        comment="all_to_full | tier_off | tool_off | sandbox_off | tenant_off",
    ),
    Column("target", String(256), primary_key=True, comment="tier, tool or tenant; '' for none"),
    Column("active", Boolean, nullable=False),
    Column("reason", Text),
    Column("changed_by", String(128), nullable=False),
    Column("changed_at", DateTime(timezone=True), nullable=False),
)

kill_switch_events = Table(
    "kill_switch_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),
    Column("target", String(256), nullable=False),
    Column("active", Boolean, nullable=False),
    Column("reason", Text),
    Column("actor", String(128), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

context_events = Table(
    "context_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("tenant_id", String(128), ForeignKey("tenants.id"), nullable=False),
    Column("session_id", String(ID), ForeignKey("sessions.id"), nullable=False),
    Column(
        "step_id",
        String(ID),
        ForeignKey("steps.id"),
        nullable=False,
        comment="the step whose prompt was condensed",
    ),
    Column("api", String(16), nullable=False, comment="chat | responses | compact"),
    Column("masked", Integer, nullable=False, comment="tool outputs masked"),
    Column("clipped", Integer, nullable=False, comment="tool outputs clipped"),
    Column("summarized", Integer, nullable=False, comment="messages one summary stands for"),
    Column("dropped", Integer, nullable=False, comment="messages removed without a summary"),
    Column("tokens_before", Integer, nullable=False),
    Column("tokens_after", Integer, nullable=False),
    Column("exact", Boolean, nullable=False, comment="tokens_after is the tier's own count"),
    Column("summarizer", String(16), comment="fast | full | extractive | reused"),
    Column("summary", Text),
    Column(
        "summary_step_id",
        String(ID),
        comment="the step that wrote the summary (no key: recorded on its own)",
    ),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Index("ix_context_events_session", "session_id", "id"),
)
