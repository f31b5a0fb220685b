"""Persistence adapter: SQLAlchemy 2 models and session handling (SQLite and PostgreSQL alike)."""
