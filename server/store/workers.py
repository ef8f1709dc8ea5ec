"""The worker rows: each rank's heartbeat, its group and state, and the limits the group publishes."""

from __future__ import annotations

import json
import time

from server.store.connections import Connections
from server.store.flags import drain_flag, error_flag


class Workers(Connections):
    """The workers table (a part of `JobStore`)."""

    def heartbeat(self, worker: str, *, instance: str, group_id: str, state: str, info: dict) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO workers (worker, instance, group_id, state, info, heartbeat_at) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (worker) DO UPDATE SET instance = excluded.instance, "
                "group_id = excluded.group_id, "
                "state = excluded.state, info = excluded.info, heartbeat_at = excluded.heartbeat_at",
                (worker, instance, group_id, state, json.dumps(info), time.time()),
            )

    def workers(self, *, group_id: str | None = None, instance: str | None = None) -> list[dict]:
        """Worker rows, newest heartbeat first."""
        where, args = [], []
        for column, value in (("group_id", group_id), ("instance", instance)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = "SELECT * FROM workers" + (f" WHERE {' AND '.join(where)}" if where else "")
        rows = self._db.execute(sql + " ORDER BY heartbeat_at DESC", args).fetchall()
        return [dict(r) | {"info": json.loads(r["info"])} for r in rows]

    def forget_group(self, group_id: str) -> None:
        """Remove the rows and flags of a worker group that is gone."""
        with self._write() as db:
            db.execute("DELETE FROM workers WHERE group_id = ?", (group_id,))
            db.execute("DELETE FROM flags WHERE name IN (?, ?)", (drain_flag(group_id), error_flag(group_id)))

    def group_stopped(self, group_id: str) -> None:
        """Mark the rows of a group its server ended as stopped: a rank killed mid-heartbeat left "ready",
        which read as serving for seconds. The rows stay (the limits the group published are still read)."""
        with self._write() as db:
            db.execute("UPDATE workers SET state = 'stopped' WHERE group_id = ?", (group_id,))

    def prune_workers(self, *, stale_after: float) -> int:
        """Remove worker rows silent for `stale_after` seconds (groups that vanished), keeping the newest row
        so the API still knows the model's last published limits; returns how many went."""
        with self._write() as db:
            return db.execute(
                "DELETE FROM workers WHERE heartbeat_at < ? "
                "AND worker <> (SELECT worker FROM workers ORDER BY heartbeat_at DESC LIMIT 1)",
                (time.time() - stale_after,),
            ).rowcount
