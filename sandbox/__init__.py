"""The sandbox service: tool calls under deny-by-default permissions, in real isolation.

Split as policy (``policy``: what may run, pure), runtime (``runtime``: where and how it runs:
bubblewrap + seccomp + cgroups + rlimits), tools (``tools``: what each tool does), and the wire
(``service``, ``client``), with one exception tree (``errors``). It never imports the gateway.
"""
