"""The base of every configuration section (gateway/config.py): unknown fields are an error
at start-up, naming the field; a section never changes once loaded."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
