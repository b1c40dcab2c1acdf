"""trajectory store: tenants, sessions, steps, tool calls, rewards, feedback, blobs

Revision ID: 0001
Revises:
Create Date: 2026-11-30 03:41:02.746712
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False, comment="JSON, as the client sent it"),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_blobs")),
    )
    op.create_table(
        "tenants",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tenants")),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("api_key", sa.String(length=128), nullable=False),
        sa.Column(
            "external_id",
            sa.String(length=256),
            nullable=True,
            comment="X-Session-Id or the request's `user`",
        ),
        sa.Column("task_id", sa.String(length=256), nullable=True),
        sa.Column(
            "group_id",
            sa.String(length=256),
            nullable=True,
            comment="GRPO group: sessions sampled for one task",
        ),
        sa.Column(
            "task_spec",
            sa.JSON(),
            nullable=True,
            comment="expected actions for API-correctness rewards",
        ),
        sa.Column("status", sa.String(length=16), nullable=False, comment="open | ended"),
        sa.Column("outcome", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_sessions_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sessions")),
        sa.UniqueConstraint("tenant_id", "external_id", name=op.f("uq_sessions_tenant_id")),
    )
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.create_index(
            "ix_sessions_tenant_created", ["tenant_id", "created_at"], unique=False
        )

    op.create_table(
        "steps",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False, comment="order within the session"),
        sa.Column("choice_index", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("endpoint", sa.String(length=16), nullable=False),
        sa.Column("request_sha256", sa.String(length=64), nullable=False),
        sa.Column(
            "response",
            sa.JSON(),
            nullable=True,
            comment="the assistant message (or completion text) of this choice",
        ),
        sa.Column(
            "prompt_token_ids",
            sa.LargeBinary(),
            nullable=True,
            comment="int32 LE, exactly as vLLM returned",
        ),
        sa.Column("completion_token_ids", sa.LargeBinary(), nullable=True, comment="int32 LE"),
        sa.Column(
            "logprobs",
            sa.LargeBinary(),
            nullable=True,
            comment="float32 LE, one per completion token",
        ),
        sa.Column("tier", sa.String(length=8), nullable=True),
        sa.Column(
            "model",
            sa.String(length=256),
            nullable=True,
            comment="served model name: the model version",
        ),
        sa.Column("replica", sa.String(length=256), nullable=True),
        sa.Column("policy", sa.String(length=64), nullable=True),
        sa.Column(
            "propensity",
            sa.Float(),
            nullable=True,
            comment="probability the policy gave the chosen tier",
        ),
        sa.Column("route_reason", sa.Text(), nullable=True),
        sa.Column("features", sa.JSON(), nullable=True),
        sa.Column("fallback", sa.Boolean(), nullable=False),
        sa.Column("escalated", sa.Boolean(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column(
            "status", sa.Integer(), nullable=False, comment="HTTP status given to the client"
        ),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "rewritten",
            sa.Boolean(),
            nullable=False,
            comment="history does not extend the last step",
        ),
        sa.Column(
            "prefix_sha256",
            sa.String(length=64),
            nullable=True,
            comment="hash of the history this step continued",
        ),
        sa.Column(
            "continuation_sha256",
            sa.String(length=64),
            nullable=True,
            comment="hash of history + this answer",
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_sha256"], ["blobs.sha256"], name=op.f("fk_steps_request_sha256_blobs")
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_steps_session_id_sessions")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_steps_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_steps")),
    )
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.create_index(
            "ix_steps_session_seq", ["session_id", "seq", "choice_index"], unique=False
        )
        batch_op.create_index(
            "ix_steps_tenant_continuation", ["tenant_id", "continuation_sha256"], unique=False
        )
        batch_op.create_index("ix_steps_tenant_created", ["tenant_id", "created_at"], unique=False)

    op.create_table(
        "feedback",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=32), nullable=False),
        sa.Column("step_id", sa.String(length=32), nullable=True),
        sa.Column("score", sa.Float(), nullable=False),
        sa.Column("label", sa.String(length=64), nullable=True),
        sa.Column("comment", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_feedback_session_id_sessions")
        ),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"], name=op.f("fk_feedback_step_id_steps")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_feedback_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feedback")),
    )
    with op.batch_alter_table("feedback", schema=None) as batch_op:
        batch_op.create_index("ix_feedback_session", ["session_id"], unique=False)

    op.create_table(
        "tool_calls",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=32), nullable=False),
        sa.Column("step_id", sa.String(length=32), nullable=False),
        sa.Column(
            "call_id", sa.String(length=128), nullable=True, comment="the model's tool_call id"
        ),
        sa.Column("tool", sa.String(length=256), nullable=False),
        sa.Column("arguments", sa.Text(), nullable=False),
        sa.Column(
            "arguments_valid",
            sa.Boolean(),
            nullable=False,
            comment="JSON object matching the schema",
        ),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column(
            "result_step_id",
            sa.String(length=32),
            nullable=True,
            comment="the step whose request carried the result",
        ),
        sa.Column(
            "status", sa.String(length=16), nullable=False, comment="pending | ok | error | denied"
        ),
        sa.Column("exit_status", sa.Integer(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=True),
        sa.Column("denial", sa.Text(), nullable=True),
        sa.Column("injected_fault", sa.String(length=64), nullable=True),
        sa.Column(
            "attestation",
            sa.String(length=64),
            nullable=True,
            comment="sandbox SHA-256 over request and result",
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_tool_calls_session_id_sessions")
        ),
        sa.ForeignKeyConstraint(
            ["step_id"], ["steps.id"], name=op.f("fk_tool_calls_step_id_steps")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_tool_calls_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_calls")),
    )
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.create_index("ix_tool_calls_session_call", ["session_id", "call_id"], unique=False)

    op.create_table(
        "rewards",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("session_id", sa.String(length=32), nullable=False),
        sa.Column("step_id", sa.String(length=32), nullable=True),
        sa.Column("tool_call_id", sa.String(length=32), nullable=True),
        sa.Column(
            "scope", sa.String(length=16), nullable=False, comment="session | step | tool_call"
        ),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column(
            "source",
            sa.String(length=32),
            nullable=False,
            comment="gateway | feedback | client | hook",
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name=op.f("fk_rewards_session_id_sessions")
        ),
        sa.ForeignKeyConstraint(["step_id"], ["steps.id"], name=op.f("fk_rewards_step_id_steps")),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_rewards_tenant_id_tenants")
        ),
        sa.ForeignKeyConstraint(
            ["tool_call_id"], ["tool_calls.id"], name=op.f("fk_rewards_tool_call_id_tool_calls")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rewards")),
    )
    with op.batch_alter_table("rewards", schema=None) as batch_op:
        batch_op.create_index("ix_rewards_session", ["session_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("rewards", schema=None) as batch_op:
        batch_op.drop_index("ix_rewards_session")

    op.drop_table("rewards")
    with op.batch_alter_table("tool_calls", schema=None) as batch_op:
        batch_op.drop_index("ix_tool_calls_session_call")

    op.drop_table("tool_calls")
    with op.batch_alter_table("feedback", schema=None) as batch_op:
        batch_op.drop_index("ix_feedback_session")

    op.drop_table("feedback")
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_index("ix_steps_tenant_created")
        batch_op.drop_index("ix_steps_tenant_continuation")
        batch_op.drop_index("ix_steps_session_seq")

    op.drop_table("steps")
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index("ix_sessions_tenant_created")

    op.drop_table("sessions")
    op.drop_table("tenants")
    op.drop_table("blobs")
