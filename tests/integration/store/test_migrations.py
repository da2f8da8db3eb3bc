"""The migration runner: in order, once, safe under a stampede, strict about edits."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from store.migrate import MigrationError, load_migrations, migrate


async def _applied(dsn: str) -> list[tuple[str, str]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT name, checksum FROM schema_migrations ORDER BY name")
        return [(str(name), str(checksum)) for name, checksum in await cursor.fetchall()]


async def test_eight_runners_at_once_apply_each_file_exactly_once(
    make_database: Callable[[], str],
) -> None:
    dsn = make_database()
    results = await asyncio.gather(*(migrate(dsn) for _ in range(8)))
    files = [migration.name for migration in load_migrations()]
    assert sorted(results, key=len) == [[]] * 7 + [files]
    assert await _applied(dsn) == [
        (migration.name, migration.checksum) for migration in load_migrations()
    ]
    # A no-op the second time, and again under a stampede.
    assert await migrate(dsn) == []
    assert await asyncio.gather(*(migrate(dsn) for _ in range(8))) == [[]] * 8


@pytest.fixture
def scratch_package(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An importable package of migrations the test can edit."""
    name = f"scratch_migrations_{tmp_path.name.replace('-', '_')}"
    package = tmp_path / name
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "0001_first.sql").write_text("CREATE TABLE first (id int);")
    sys.path.insert(0, str(tmp_path))
    try:
        yield name, package
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


async def test_an_edited_applied_migration_stops_the_runner(
    make_database: Callable[[], str], scratch_package: tuple[str, Path]
) -> None:
    name, package = scratch_package
    dsn = make_database()
    assert await migrate(dsn, package=name) == ["0001_first.sql"]
    (package / "0001_first.sql").write_text("CREATE TABLE first (id bigint);")
    (package / "0002_second.sql").write_text("CREATE TABLE second (id int);")
    with pytest.raises(MigrationError, match=r"0001_first\.sql was applied with checksum"):
        await migrate(dsn, package=name)
    assert [applied for applied, _ in await _applied(dsn)] == ["0001_first.sql"]


async def test_a_failing_migration_leaves_no_trace_and_runs_again_once_fixed(
    make_database: Callable[[], str], scratch_package: tuple[str, Path]
) -> None:
    name, package = scratch_package
    dsn = make_database()
    (package / "0002_broken.sql").write_text(
        "CREATE TABLE half_done (id int);\nSELECT no_such_function();"
    )
    with pytest.raises(psycopg.errors.UndefinedFunction):
        await migrate(dsn, package=name)
    assert [applied for applied, _ in await _applied(dsn)] == ["0001_first.sql"]
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cursor = await conn.execute("SELECT to_regclass('half_done') IS NULL")
        assert await cursor.fetchone() == (True,)
    (package / "0002_broken.sql").write_text("CREATE TABLE half_done (id int);")
    assert await migrate(dsn, package=name) == ["0002_broken.sql"]


async def test_badly_named_or_duplicate_files_are_refused(
    scratch_package: tuple[str, Path],
) -> None:
    name, package = scratch_package
    (package / "0001_again.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match="share the number"):
        load_migrations(name)
    (package / "0001_again.sql").unlink()
    (package / "2_Second.sql").write_text("SELECT 1;")
    with pytest.raises(MigrationError, match=r"NNNN_lowercase_words\.sql"):
        load_migrations(name)
