"""Log set-up shared by the API process and the worker ranks: plain lines for people, or one JSON object per
line (`--log-format json`) for log collectors. A record's `extra={"fields": {...}}` (the job store's state
changes) becomes top-level keys of its JSON object."""

from __future__ import annotations

import json
import logging
import sys
import time

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "fields", {}),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=True, default=str)


def setup(level: str, fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {FORMATS}, got {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def last_line(line: str, fmt: str | None) -> None:
    """The line a command ends with, on stderr in the log's format: a collector reading JSON gets a record
    (error level) it can parse, not plain text among the records."""
    if (fmt or "").lower() == "json":  # as given: ITHACA_LOG_FORMAT=JSON is taken as json
        line = JsonFormatter().format(logging.LogRecord("ithaca", logging.ERROR, "", 0, line, None, None))
    print(line, file=sys.stderr)
