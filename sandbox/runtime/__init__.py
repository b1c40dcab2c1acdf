"""Where tool code runs. ``Runtime.run`` executes one command in a workspace under limits."""
