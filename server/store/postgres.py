"""The PostgreSQL backend of the job store (`--store postgresql://USER@HOST:PORT/DB`), through psycopg 3.

Several servers on several boxes share one database: claims take the oldest queued row with
`FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait on each other and each job is claimed once. The
store's SQL is written once (server/store/) with SQLite's `?`/`?N` parameters; `Connection` rewrites
them to psycopg's `%s` and reorders the arguments. Lock waits longer than the busy timeout
(`lock_timeout`), deadlocks and a lost connection end in `StoreBusy` (the API answers 503; the next
statement connects again).
"""

from __future__ import annotations

import functools
import re
import select

from server.store.errors import StoreBusy, StoreError, disk_full

_FIX = "check the URL, that the PostgreSQL server runs and that this user may connect and create tables"
_LOGIN_FIX = "check the user in the URL and its password, in PGPASSWORD or ~/.pgpass"
_URL_FIX = "write it as postgresql://USER@HOST:PORT/DB?PARAMETER=VALUE (libpq's), special characters %-coded"


def redact(url: str) -> str:
    """The URL without its password (`USER:PASSWORD@`, or a `password=` parameter), for messages and logs."""
    return re.sub(r"(\bpassword=)[^&\s]*", r"\1***", re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url))


class Row:
    """A result row read by column name or by position, like `sqlite3.Row` (`dict(row)` works too)."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: dict[str, int], values):
        self._names, self._values = names, values

    def __getitem__(self, key):
        return self._values[key if isinstance(key, int) else self._names[key]]

    def keys(self):
        return list(self._names)

    def __len__(self) -> int:
        return len(self._values)


def _row_factory(cursor):
    names = {c.name: i for i, c in enumerate(cursor.description or ())}
    return lambda values: Row(names, values)


_TOKEN = re.compile(r"'(?:[^']|'')*'|\?(\d*)|%")


@functools.lru_cache(maxsize=512)
def translate(sql: str) -> tuple[str, tuple[int, ...]]:
    """SQLite's parameters (`?` the next one, `?N` the N-th) as psycopg's `%s`, and for each `%s` the index
    of its argument; a literal `%` is doubled."""
    order: list[int] = []
    largest = 0

    def one(m: re.Match) -> str:
        nonlocal largest
        text = m.group(0)
        if text.startswith("'"):
            return text.replace("%", "%%")
        if text == "%":
            return "%%"
        number = int(m.group(1)) if m.group(1) else largest + 1
        largest = max(largest, number)
        order.append(number - 1)
        return "%s"

    return _TOKEN.sub(one, sql), tuple(order)


class Connection:
    """One psycopg connection in autocommit mode (a write transaction is an explicit BEGIN ... COMMIT) that
    takes the store's SQL as written for SQLite."""

    def __init__(self, url: str, busy_timeout: float):
        import psycopg
        import psycopg.errors

        self._psycopg = psycopg
        self.url = url
        try:
            self._conn = psycopg.connect(
                url,
                autocommit=True,
                row_factory=_row_factory,
                connect_timeout=max(1, round(busy_timeout)) + 9,
                options=f"-c lock_timeout={max(1, int(busy_timeout * 1000))}",
                application_name="ithaca",
            )
        except psycopg.OperationalError as e:
            said = redact(_one_line(e))
            if "authentication failed" in said or "no password supplied" in said:  # it answered: no network
                raise StoreError(redact(url), f"refused the login ({said})", fix=_LOGIN_FIX) from None
            raise StoreError(redact(url), f"cannot be reached ({said})", fix=_FIX) from None
        except psycopg.Error as e:  # libpq could not read the URL
            raise StoreError(
                redact(url), f"is not a PostgreSQL URL libpq reads ({redact(_one_line(e))})", fix=_URL_FIX
            ) from None

    @property
    def broken(self) -> bool:
        """Lost, or ended by the server while idle: between statements nothing is owed to this autocommit
        connection (no LISTEN), so anything to read is the server's goodbye (a restart, an administrator's
        kill) and the next statement would fail (the first request after a restart was a 503 while
        /ready said ready)."""
        if self._conn.closed or self._conn.broken:
            return True
        said = select.poll()
        said.register(self._conn.fileno(), select.POLLIN)
        return bool(said.poll(0))

    def execute(self, sql: str, args=()):
        query, order = translate(sql)
        try:
            return self._conn.execute(query, [args[i] for i in order] if order else None)
        except self._psycopg.Error as e:
            raise self._mapped(e) from e

    def executemany(self, sql: str, rows):
        query, order = translate(sql)
        try:
            with self._conn.cursor() as cur:
                cur.executemany(query, [[row[i] for i in order] for row in rows])
                return cur
        except self._psycopg.Error as e:
            raise self._mapped(e) from e

    def close(self) -> None:
        self._conn.close()

    def _mapped(self, error: Exception) -> Exception:
        errors = self._psycopg.errors
        if isinstance(error, errors.LockNotAvailable | errors.DeadlockDetected | errors.SerializationFailure):
            return StoreBusy(f"the job store is busy ({_one_line(error)}); retry shortly")
        if isinstance(error, errors.DiskFull):
            return disk_full(_one_line(error))
        if isinstance(error, self._psycopg.OperationalError) and self.broken:
            return StoreBusy(f"the job store is unreachable ({_one_line(error)}); retry shortly")
        return error


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


class PostgresBackend:
    """What the PostgreSQL store does differently from SQLite; server/store/ holds the rest."""

    name = "postgresql"
    begin = "BEGIN"
    skip_locked = " FOR UPDATE SKIP LOCKED"  # a claimer passes over the rows another claimer holds
    types = {"pk": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", "float": "DOUBLE PRECISION"}

    def __init__(self, url: str, busy_timeout: float):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise StoreError(
                redact(url), "needs psycopg 3", fix="pip install 'psycopg[binary]' (a dependency of ithaca)"
            ) from None
        self.url, self.busy_timeout = url, busy_timeout
        self.where = redact(url)

    def connect(self) -> Connection:
        return Connection(self.url, self.busy_timeout)

    def prepare(self, db: Connection) -> None:
        pass

    def lock(self, db: Connection, key: int) -> None:
        """Inside a write transaction: one process at a time past this point for `key`, until it commits."""
        db.execute("SELECT pg_advisory_xact_lock(?)", (key,))

    def columns(self, db: Connection, table: str) -> set[str]:
        rows = db.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = ?",
            (table,),
        ).fetchall()
        return {r[0] for r in rows}

    def has_table(self, db: Connection, table: str) -> bool:
        return db.execute("SELECT to_regclass(?)", (table,)).fetchone()[0] is not None
