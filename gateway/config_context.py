"""The context policy's configuration sections (docs/context.md), part of the one typed
configuration in gateway/config.py (which re-exports them): the policy and what a tenant
or API key may change of it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config_section import Section
from router.types import Tier


class ContextOverride(Section):
    """What one tenant or API key changes of the context policy (docs/context.md)."""

    mode: Literal["off", "auto"] | None = None
    budget_fraction: float | None = Field(default=None, gt=0, le=1)
    budget_tokens: int | None = Field(default=None, gt=0)
    summarizer: Literal["fast", "full", "extractive"] | None = None
    rungs: list[Literal["mask", "summarize", "drop"]] | None = None
    clear_to_fraction: float | None = Field(default=None, gt=0, le=1)
    mask_digest_chars: int | None = Field(default=None, ge=0)
    summarize_to_mark: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None


class ContextSettings(Section):
    """Context management of chat completions: mask, summarize, drop (docs/context.md)."""

    mode: Literal["off", "auto"] = Field(
        default="off",
        description="auto: condense chat requests over their budget; a request turns it on or "
        "off with the x-gearshift-context header",
    )
    budget_fraction: float = Field(
        default=0.75, gt=0, le=1, description="budget as a fraction of the tier's context window"
    )
    budget_tokens: int | None = Field(
        default=None, gt=0, description="a fixed budget in prompt tokens (overrides the fraction)"
    )
    window_tokens: dict[Tier, int] = Field(
        default_factory=dict,
        description="context window per tier; default: the replica's max_model_len "
        "(/v1/models), else embedded.max_model_len",
    )
    keep_tool_results: int = Field(
        default=3, ge=0, description="the latest tool results are never masked"
    )
    keep_recent_messages: int = Field(
        default=4, ge=1, description="the latest messages are never summarized"
    )
    clear_at_least_tokens: int = Field(
        default=512,
        ge=0,
        description="each clearing removes at least this many tokens, so the next steps share "
        "the condensed prefix (the engine's prefix cache) instead of condensing again",
    )
    clear_to_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="a clearing aims at this fraction of the budget, so that many next steps "
        "fit in the room it made (one condensation, then a shared prefix) instead of one",
    )
    mask_digest_chars: int = Field(
        default=240,
        ge=0,
        description="a masked tool output's placeholder keeps its errors, named values, paths "
        "and identifiers, in at most this many characters (and a quarter of the output); 0: none",
    )
    summarize_to_mark: bool = Field(
        default=True,
        description="a clearing that masking leaves above clear_to_fraction of the budget "
        "goes on to it with the extractive summary (no model call); false: masking stops "
        "once it leaves clear_at_least_tokens of room",
    )
    summarizer: Literal["fast", "full", "extractive"] = Field(
        default="extractive",
        description="extractive: the lines with numbers, paths, identifiers, errors and "
        "decisions, no model call (the default: a real reader answered more of the early "
        "facts from it than from a model's summary, docs/decisions/context-summarizer.md); "
        "fast: the fast tier writes the summary (extractive when it fails); full: the full "
        "tier does",
    )
    rungs: list[Literal["mask", "summarize", "drop"]] = Field(
        default=["mask", "summarize", "drop"],
        description="the ladder's rungs, in this order of trial; drop alone: drop the "
        "oldest turns (the naive baseline)",
    )
    summary_max_tokens: int = Field(default=400, ge=32, le=8192)
    summary_timeout_s: float = Field(default=30.0, gt=0)
    exact_margin: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="an estimate this close to the budget (a fraction of it), and the first "
        "over it, is checked with the tier's exact /tokenize; 0: never",
    )
    sessions: int = Field(
        default=10_000, ge=1, description="sessions whose last condensation is remembered (LRU)"
    )
    truncation: Literal["auto", "disabled"] = Field(
        default="disabled",
        description="the truncation of a /v1/responses request that sends none (auto: "
        "condense its chain to the budget); a request's own value wins",
    )
    tenants: dict[str, ContextOverride] = Field(default_factory=dict)
    keys: dict[str, ContextOverride] = Field(
        default_factory=dict, description="by API key name (auth.keys), over the tenant's"
    )

    def truncation_for(self, tenant: str, key: str) -> Literal["auto", "disabled"]:
        """The Responses ``truncation`` default of a key of ``tenant``: key, tenant, config."""
        for o in (self.keys.get(key), self.tenants.get(tenant)):
            if o is not None and o.truncation is not None:
                return o.truncation
        return self.truncation
