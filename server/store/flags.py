"""A worker group's flags: the drain asked of it, and the first error one of its ranks reported."""

from __future__ import annotations

from server.store.connections import Connections


def drain_flag(group_id: str) -> str:
    return f"drain:{group_id}"


def error_flag(group_id: str) -> str:
    return f"error:{group_id}"


class GroupFlags(Connections):
    """The flags table: drains and group errors (a part of `JobStore`)."""

    def request_drain(self, group_id: str) -> None:
        """Ask a worker group to stop claiming and exit once its running job is done."""
        with self._write() as db:
            db.execute(
                "INSERT INTO flags (name, value) VALUES (?, '1') "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (drain_flag(group_id),),
            )

    def drain_requested(self, group_id: str) -> bool:
        return self._flag(drain_flag(group_id)) is not None

    def record_error(self, group_id: str, message: str) -> None:
        """Keep the first error a rank of the group reports (the cause; later ones are mostly its echo)."""
        with self._write() as db:
            db.execute(
                "INSERT INTO flags (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                (error_flag(group_id), message),
            )

    def group_error(self, group_id: str) -> str | None:
        return self._flag(error_flag(group_id))

    def _flag(self, name: str) -> str | None:
        row = self._db.execute("SELECT value FROM flags WHERE name = ?", (name,)).fetchone()
        return None if row is None else row[0]
