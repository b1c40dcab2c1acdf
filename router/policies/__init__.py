"""Built-in routing policies, one module each; importing a module registers it."""
