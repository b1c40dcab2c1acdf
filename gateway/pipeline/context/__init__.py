"""Context management: keep a long chat session's prompt within its token budget.

A stage of the request path between routing and the upstream body (docs/context.md):

    budget (config, tenant, key, header) → count (estimate; exact /tokenize near the
    budget) → ladder: mask old tool outputs → summarize the oldest span (fast tier, or
    extractive) → drop the summarized span → the messages the upstream body is built from

Pure logic (``messages``, ``extractive``, ``ladder``) takes no I/O; ``counting`` and
``summary`` talk to the tiers; ``stage`` puts them together per request.
"""
