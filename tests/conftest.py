"""Shared fixtures: a fresh, migrated database per test, and the app over it.

The migrations run once per test process, into a template: on SQLite a migrated file that each test copies, on
PostgreSQL (when PREFLIGHT_TEST_DATABASE_URL is set, as CI does) a template database that each test clones with
``CREATE DATABASE … TEMPLATE`` and drops afterwards. Every test still gets a database of its own — tests run in
parallel (pytest-xdist) and may add triggers, kill connections or downgrade the schema — for about 0.1 s of set-up
instead of the migrations' 1.5–2 s.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import shutil

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from service.db.migrate import upgrade
from service.db.session import Database
from service.settings import Settings
from service.signing import KeyStore
from tests.support import ADMIN

PG_URL = os.environ.get("PREFLIGHT_TEST_DATABASE_URL")
DB_KINDS = ["sqlite"] + (["postgresql"] if PG_URL else [])
PG_PREFIX = "pft_"  # every database the suite creates on the server; a run drops the ones dead runs left behind


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``postgresql`` parameter of ``db_url`` carries the ``postgres`` marker (``-m 'not postgres'`` skips it)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("db_url") == "postgresql":
            item.add_marker(pytest.mark.postgres)


class PostgresTemplates:
    """A migrated template database on the test server, and a clone of it per test (dropped after the test)."""

    def __init__(self, url: str):
        self.url = make_url(url)
        self.admin = _admin_engine(self.url)
        self.prefix = f"{PG_PREFIX}{os.getpid()}_"
        self.counter = itertools.count()
        self._drop_left_behind()
        self.template = self.prefix + "template"
        self._execute(f'CREATE DATABASE "{self.template}"')
        upgrade(self.url_of(self.template))

    def url_of(self, name: str) -> str:
        return self.url.set(database=name).render_as_string(hide_password=False)

    def _execute(self, sql: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(sql))

    def _drop_left_behind(self) -> None:
        """Databases of runs whose process is gone (killed, or a crash before teardown)."""
        with self.admin.connect() as conn:
            names = (
                conn.execute(text("SELECT datname FROM pg_database WHERE datname LIKE :p"), {"p": PG_PREFIX + "%"})
                .scalars()
                .all()
            )
        for name in names:
            pid = name[len(PG_PREFIX) :].split("_", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                self.drop(name)

    def clone(self) -> str:
        name = f"{self.prefix}{next(self.counter)}"
        self._execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name

    def drop(self, name: str) -> None:
        """WITH (FORCE) ends the sessions a test left open (a server thread cut off mid-transaction, an engine not
        disposed) instead of waiting for them."""
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        self.drop(self.template)
        self.admin.dispose()


def _admin_engine(url):
    """CREATE and DROP DATABASE run from the server's maintenance database ``postgres`` where it can be reached (a
    session there is never ended by another run's clean-up of the named database), else from the named one."""
    for candidate in (url.set(database="postgres"), url):
        engine = create_engine(candidate, isolation_level="AUTOCOMMIT", pool_size=1, max_overflow=0, pool_pre_ping=True)
        try:
            with engine.connect():
                return engine
        except Exception:  # noqa: BLE001 - no access to the maintenance database: use the named one
            engine.dispose()
    raise RuntimeError(f"cannot connect to the test database server at {url.render_as_string()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("template") / "preflight.db"
    upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def postgres_templates():
    if not PG_URL:
        pytest.skip("PREFLIGHT_TEST_DATABASE_URL is not set")
    templates = PostgresTemplates(PG_URL)
    yield templates
    templates.close()


@pytest.fixture(params=DB_KINDS)
def db_url(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> str:
    if request.param == "sqlite":
        path = tmp_path / "preflight.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    templates: PostgresTemplates = request.getfixturevalue("postgres_templates")
    name = templates.clone()
    yield templates.url_of(name)
    templates.drop(name)


@pytest.fixture
def settings(tmp_path: pathlib.Path, db_url: str) -> Settings:
    return Settings(data_dir=tmp_path / "var", database_url=db_url, admin_token=ADMIN)


@pytest.fixture
def keys(settings: Settings) -> KeyStore:
    return KeyStore(settings.key_dir)


@pytest.fixture
def db(settings: Settings):
    database = Database(settings.resolved_database_url)
    yield database
    database.engine.dispose()


@pytest.fixture
def client(settings: Settings, db: Database, keys: KeyStore):
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    app = create_app(settings, db=db, keys=keys)
    with TestClient(app) as c:
        c.headers["Authorization"] = f"Bearer {ADMIN}"
        yield c
