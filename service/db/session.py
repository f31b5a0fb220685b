"""Engine and session factory for one database URL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

READ_ONLY = "preflight_read_only"  # execution option: SQLite begins a deferred (read) transaction
THREADS = 8  # worker threads per service process for blocking work (service/api/app.py sets anyio's limiter)


def make_engine(url: str) -> Engine:
    """An engine for SQLite or PostgreSQL (psycopg 3).

    SQLite: WAL, foreign keys on, and every transaction starts with ``BEGIN IMMEDIATE`` (SQLAlchemy's documented
    recipe), so concurrent writers — threads or processes — queue on the database's single write lock instead of
    failing half-way. PostgreSQL: a fixed pool as large as the worker's thread pool.
    """
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30, "isolation_level": None})

        @event.listens_for(engine, "connect")
        def _pragma(dbapi_conn, _):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):  # pragma: no cover - trivial
            # a connection marked read_only (the cache-epoch poller) takes no write lock
            conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

        return engine
    # No pre-ping (a round trip per checkout): a connection that fails with a disconnect invalidates the whole
    # pool, so after an outage the next checkout opens fresh connections (see tests/api/test_outage.py).
    # The pool holds a connection for each of the worker's threads (THREADS, plus the audit sealer, the cache-epoch
    # poller and the agent-writes threads): an overflow connection would be
    # opened and closed per request under load, which costs far more than the query.
    return create_engine(url, pool_size=THREADS + 4, max_overflow=0, pool_timeout=30)


def after_commit(session: Session, callback) -> None:
    """Run ``callback()`` once the transaction of ``Database.transaction`` has committed (not on rollback): e.g. drop
    a cache entry only when other readers can already see the change."""
    session.info.setdefault("after_commit", []).append(callback)


class Database:
    def __init__(self, url: str, *, audit_keys=None):
        from ..audit import Sealer

        self.url = url
        self.engine = make_engine(url)
        # the audit log finds the MAC keys through the session (service/audit.py ``audit_keys``)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False, info={"database": self})
        self.audit_keys = audit_keys  # service/audit.py AuditKeys: set by the service and the CLI (key dir at hand)
        self.sealer = Sealer(self)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One unit of work: commits on success, rolls back on any exception (no half-written rows). Audit events
        it appended are sealed into the chain right after the commit; ``after_commit`` callbacks run then."""
        with self.sessions() as session:
            with session.begin():
                yield session
            appended = session.info.pop("audit_appended", False)
            callbacks = session.info.pop("after_commit", [])
        if appended:
            self.sealer.seal_soon()
        for callback in callbacks:
            callback()

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only unit of work over one consistent snapshot that takes no write lock: SQLite begins a deferred
        transaction (WAL: writers go on while it reads), PostgreSQL a ``REPEATABLE READ, READ ONLY`` one. For long
        reads (verifying the whole audit chain) that must not hold up writers."""
        with self.engine.connect() as conn:
            if self.dialect == "sqlite":
                conn = conn.execution_options(**{READ_ONLY: True})
            else:
                conn = conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with Session(bind=conn, expire_on_commit=False, info={"database": self}) as session:
                with session.begin():
                    yield session
