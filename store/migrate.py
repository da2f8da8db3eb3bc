"""Apply the numbered SQL files of the ``migrations`` package, in order, once.

Each file runs in its own transaction together with the row that records it,
so a failing file leaves no trace and is retried on the next start. Runners are
serialized by an advisory lock, so a fleet starting at the same moment applies
each file exactly once and the late starters find nothing to do. An applied
file whose content has changed stops the runner: the database no longer matches
what the code believes it is.

Run by hand with ``python -m store.migrate [DSN]`` (default ``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import sys
from dataclasses import dataclass
from importlib import resources

import psycopg

from schemas.errors import FailedPrecondition

MIGRATIONS_PACKAGE = "migrations"

# Any fixed 64-bit number works; it only has to be the same for every runner.
MIGRATION_LOCK_KEY = 0x77666A6F62730001

_FILE_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

CREATE_MIGRATIONS_TABLE = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""
LOCK_MIGRATIONS = "SELECT pg_advisory_lock(%s)"
UNLOCK_MIGRATIONS = "SELECT pg_advisory_unlock(%s)"
SELECT_APPLIED = "SELECT name, checksum FROM schema_migrations"
RECORD_APPLIED = "INSERT INTO schema_migrations (name, checksum) VALUES (%s, %s)"


class MigrationError(FailedPrecondition):
    """The migration files and the database disagree; nothing was applied."""


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(package: str = MIGRATIONS_PACKAGE) -> list[Migration]:
    """The package's ``NNNN_name.sql`` files in order; a gap-free, unique numbering."""
    found: list[Migration] = []
    for entry in resources.files(package).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        if not _FILE_NAME.match(entry.name):
            raise MigrationError(
                f"migration file {entry.name!r} is not named NNNN_lowercase_words.sql"
            )
        found.append(Migration(entry.name, entry.read_text(encoding="utf-8")))
    found.sort(key=lambda migration: migration.name)
    numbers = [migration.name[:4] for migration in found]
    duplicates = sorted({number for number in numbers if numbers.count(number) > 1})
    if duplicates:
        raise MigrationError(f"two migration files share the number(s) {', '.join(duplicates)}")
    return found


def _check_applied(migrations: list[Migration], applied: dict[str, str]) -> None:
    for migration in migrations:
        recorded = applied.get(migration.name)
        if recorded is not None and recorded != migration.checksum:
            raise MigrationError(
                f"migration {migration.name} was applied with checksum {recorded[:12]}… "
                f"but the file now has {migration.checksum[:12]}…; an applied migration "
                "must never be edited, add a new file instead"
            )


async def migrate(dsn: str, *, package: str = MIGRATIONS_PACKAGE) -> list[str]:
    """Apply every pending migration; return the names applied (empty when up to date).

    Applied migrations unknown to this code (a newer release ran first) are
    left alone, so an older worker can still start during a rollout.
    """
    migrations = load_migrations(package)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # A session lock, not a transaction lock: it must span the per-file
        # transactions. It dies with the connection if this process does.
        await conn.execute(LOCK_MIGRATIONS, (MIGRATION_LOCK_KEY,))
        try:
            await conn.execute(CREATE_MIGRATIONS_TABLE)
            cursor = await conn.execute(SELECT_APPLIED)
            applied = {str(name): str(checksum) for name, checksum in await cursor.fetchall()}
            _check_applied(migrations, applied)
            done: list[str] = []
            for migration in migrations:
                if migration.name in applied:
                    continue
                async with conn.transaction():
                    # Plain SQL without parameters goes over the simple query
                    # protocol, which accepts a whole file of statements.
                    await conn.execute(migration.sql.encode())
                    await conn.execute(RECORD_APPLIED, (migration.name, migration.checksum))
                done.append(migration.name)
            return done
        finally:
            if not conn.closed:
                await conn.execute(UNLOCK_MIGRATIONS, (MIGRATION_LOCK_KEY,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m store.migrate", description=__doc__)
    parser.add_argument("dsn", nargs="?", default=os.environ.get("DATABASE_URL", ""))
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("pass a DSN or set DATABASE_URL")
    try:
        applied = asyncio.run(migrate(args.dsn))
    except MigrationError as exc:
        print(f"migrate: {exc.message}", file=sys.stderr)
        return 1
    print("\n".join(f"applied {name}" for name in applied) or "up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
