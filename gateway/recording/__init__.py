"""Recording trajectories: capture on the request path, a batched writer off it.

``capture`` asks vLLM for token ids and log-probabilities and hides them from
clients that did not ask; ``recorder`` queues step records and writes them in
batches on its own thread; ``writer`` turns records into rows (sessions, tool
calls, reward components); ``rewards`` holds the reward components.
"""
