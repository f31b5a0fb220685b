"""The node bootstrap agent: fetch this node's signed plan, verify it offline, run exactly its argv, report back."""
