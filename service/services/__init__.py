"""Use cases over the database: plain keyword-only functions taking a session. No FastAPI here."""
