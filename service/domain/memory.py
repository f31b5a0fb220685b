"""Memory model (to be filled in by the memory work, issue 4)."""


def compute_budget(ctx):
    return None
