"""The Responses API (``/v1/responses``) on top of the completion pipeline: docs/responses.md."""
