"""The pure domain core: launch rules, model facts, GPU catalogue, memory arithmetic, rendering.

Nothing in this package imports FastAPI or SQLAlchemy; it runs the same in the CLI, the API and the tests.
"""
