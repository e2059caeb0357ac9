"""The dialect translation: repository SQL and migration DDL as PostgreSQL reads them."""

from __future__ import annotations

from ficc_core.store import dialect
from ficc_core.store.migrations import MIGRATIONS, Dialects, statements


def test_placeholders_become_psycopg_ones_outside_literals_and_percent_is_doubled():
    sql = "SELECT '?' AS q, \"a?\" , x FROM t WHERE a = ? AND b LIKE '5%' -- why?\n AND c = ?"
    assert dialect.translate(sql) == (
        "SELECT '?' AS q, \"a?\" , x FROM t WHERE a = %s AND b LIKE '5%%' -- why?\n AND c = %s"
    )
    assert dialect.translate("SELECT 'it''s ?', ?") == "SELECT 'it''s ?', %s"
    assert dialect.translate("SELECT 1 /* ? */ + ?") == "SELECT 1 /* ? */ + %s"


def test_insert_or_ignore_becomes_on_conflict_do_nothing():
    assert dialect.translate("INSERT OR IGNORE INTO p (a) VALUES (?)") == (
        "INSERT INTO p (a) VALUES (%s) ON CONFLICT DO NOTHING"
    )
    assert dialect.translate("insert or ignore into p (a) values (?) RETURNING a") == (
        "INSERT INTO p (a) values (%s) ON CONFLICT DO NOTHING RETURNING a"
    )


def test_bool_parameters_are_sent_as_integers():
    assert dialect.params((True, False, 1, "x", None, 2.5)) == (1, 0, 1, "x", None, 2.5)
    assert [type(v) for v in dialect.params((True, 1))] == [int, int]


def test_ddl_types_widen_to_postgresql_ones_of_the_same_range():
    assert dialect.translate_ddl(
        "CREATE TABLE t (id INTEGER PRIMARY KEY AUTOINCREMENT, size INTEGER NOT NULL,"
        " at REAL, data BLOB, note TEXT DEFAULT 'INTEGER REAL', PRIMARY KEY (a, b))"
    ) == (
        f"CREATE TABLE t (id {dialect.IDENTITY}, size BIGINT NOT NULL,"
        " at DOUBLE PRECISION, data BYTEA, note TEXT DEFAULT 'INTEGER REAL', PRIMARY KEY (a, b))"
    )
    assert dialect.translate_ddl("CREATE TABLE u (id INTEGER PRIMARY KEY, n INTEGER)") == (
        f"CREATE TABLE u (id {dialect.IDENTITY}, n BIGINT)"
    )
    assert dialect.translate_ddl("ALTER TABLE t ADD COLUMN pid INTEGER") == (
        "ALTER TABLE t ADD COLUMN pid BIGINT"
    )
    # Data moves are left as they are.
    assert dialect.translate_ddl("UPDATE t SET real = 1") == "UPDATE t SET real = 1"


def test_every_sqlite_only_migration_statement_has_a_postgresql_form_beside_it():
    for version in range(1, len(MIGRATIONS) + 1):
        for statement in statements(version, "postgresql"):
            lowered = statement.lower()
            for sqlite_only in ("json_object(", "rowid", "ifnull(", "pragma", "autoincrement"):
                if sqlite_only == "autoincrement":
                    lowered = dialect.translate_ddl(statement).lower()
                assert sqlite_only not in lowered, (version, statement)
    pairs = [s for migration in MIGRATIONS for s in migration if isinstance(s, Dialects)]
    assert len(pairs) >= 2
