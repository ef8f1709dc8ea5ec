"""Files written whole or not at all: under a temporary name beside the target, renamed into place once
complete, so a reader never sees part of one; a write that fails (a full disk) removes its temporary file
rather than leave it to fill the disk further."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def written(path: str, tmp: str) -> Iterator[str]:
    """`with written(path, tmp) as name:` write the whole file to `name` (`tmp`); it becomes `path` when the
    block ends, and is removed if the block raises."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        yield tmp
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise
    os.replace(tmp, path)
