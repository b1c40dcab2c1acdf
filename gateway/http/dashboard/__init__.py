"""The operators' dashboard (server-rendered HTML, SVG charts, no JavaScript)."""
