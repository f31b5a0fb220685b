"""The node bootstrap agent: fetch this node's signed plan, verify it offline, run exactly its argv, report back."""

EXIT_REFUSED = 3  # a check failed: nothing ran, the state is unchanged
EXIT_UNAVAILABLE = 75  # EX_TEMPFAIL: the service cannot be reached and no offline boot applies (systemd retries)
