"""Preflight: validate, recommend, sign and audit vLLM launch configurations."""

__version__ = "0.1.0"
