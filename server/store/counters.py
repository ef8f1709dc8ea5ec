"""Totals the workers add to and /metrics reads (steps, seconds ...), kept across restarts."""

from __future__ import annotations

from server.store.connections import Connections


class Counters(Connections):
    """The counters table (a part of `JobStore`)."""

    def add_counters(self, deltas: dict[str, float]) -> None:
        with self._write() as db:
            db.executemany(
                "INSERT INTO counters (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = counters.value + excluded.value",
                list(deltas.items()),
            )

    def counters(self) -> dict[str, float]:
        return {r[0]: r[1] for r in self._db.execute("SELECT name, value FROM counters").fetchall()}
