"""responses: the Responses API's stored state (responses and their items)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 21:16:43.713424
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "responses",
        sa.Column("id", sa.String(length=64), nullable=False, comment="resp_..."),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column(
            "session",
            sa.String(length=256),
            nullable=False,
            comment="the trajectory session's name: X-Session-Id, else the chain's first response id",
        ),
        sa.Column(
            "previous_response_id",
            sa.String(length=64),
            nullable=True,
            comment="no foreign key: a parent may be deleted",
        ),
        sa.Column(
            "status",
            sa.String(length=16),
            nullable=False,
            comment="completed | incomplete | failed",
        ),
        sa.Column("model", sa.String(length=256), nullable=True),
        sa.Column(
            "body", sa.JSON(), nullable=False, comment="the response object as the client got it"
        ),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_responses_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_responses")),
    )
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.create_index(
            "ix_responses_tenant_created", ["tenant_id", "created_at"], unique=False
        )
    op.create_table(
        "response_items",
        sa.Column("response_id", sa.String(length=64), nullable=False),
        sa.Column(
            "seq", sa.Integer(), autoincrement=False, nullable=False, comment="inputs, then outputs"
        ),
        sa.Column("tenant_id", sa.String(length=128), nullable=False),
        sa.Column("role", sa.String(length=8), nullable=False, comment="input | output"),
        sa.Column("item_id", sa.String(length=64), nullable=False),
        sa.Column("item", sa.JSON(), nullable=False, comment="the item as the API lists it"),
        sa.ForeignKeyConstraint(
            ["response_id"],
            ["responses.id"],
            name=op.f("fk_response_items_response_id_responses"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_response_items_tenant_id_tenants")
        ),
        sa.PrimaryKeyConstraint("response_id", "seq", name=op.f("pk_response_items")),
    )


def downgrade() -> None:
    op.drop_table("response_items")
    with op.batch_alter_table("responses", schema=None) as batch_op:
        batch_op.drop_index("ix_responses_tenant_created")
    op.drop_table("responses")
