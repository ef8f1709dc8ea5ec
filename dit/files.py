"""Files written whole or not at all: under a temporary name beside the target, renamed into place once
complete, so a reader never sees part of one; a write that fails (a full disk) removes its temporary file
rather than leave it to fill the disk further. And the folders they go to, checked at start."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

NEARLY_FULL_BYTES = 16 << 20  # a write that failed with less than this free failed for want of space


@contextlib.contextmanager
def written(path: str, tmp: str) -> Iterator[str]:
    """`with written(path, tmp) as name:` write the whole file to `name` (`tmp`); it becomes `path` when the
    block ends, and is removed if the block or the rename raises."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def link_to_nowhere(path: Path) -> str | None:
    """For a symbolic link whose target is gone (a check of whether the path exists looks past it), the
    message "PATH is a link to TARGET, which does not exist"; else None."""
    if path.is_symlink() and not path.exists():
        return f"{path} is a link to {os.readlink(path)}, which does not exist"
    return None


def check_folder(label: str, folder: str | Path, make: bool = True) -> None:
    """ValueError starting with `label` (the option and its value) when `folder` cannot be made or written
    in (a file in the way, no permission): found at start, not when the first file is due. Makes it, unless
    not `make` (a command that may fail later leaves no empty folder): then the nearest folder that exists
    is the one written in."""
    folder = Path(folder)
    for path in (folder, *folder.parents):  # one that cannot be made: the check looked past it
        if said := link_to_nowhere(path):
            raise ValueError(f"{label}: {said}")
    above = next(path for path in (folder, *folder.parents) if path.exists())
    if not above.is_dir():
        raise ValueError(f"{label}: {above} is a file, not a folder")
    try:
        if make:
            folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder if make else above).close()
    except OSError as e:
        raise ValueError(f"{label}: cannot write in {folder if make else above}: {e.strerror or e}") from None


def check_name(label: str, path: str | Path, written_as: str | None = None) -> None:
    """ValueError when the file's name, or `written_as` (the name it is written under until done), is longer
    than its file system takes: said at start (a long --out ran the whole job, then failed twice over)."""
    path = Path(path)
    above = next((folder for folder in path.parents if folder.exists()), Path("."))
    try:
        limit = os.pathconf(above, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    name = len(os.fsencode(path.name))
    extra = len(os.fsencode(written_as)) - name if written_as else 0
    if name + extra > limit:
        raise ValueError(
            f"{label}: the file name is {name} bytes; this file system takes {limit - extra} at most"
            + (f" (it is written as {written_as[:20]}... first)" if extra else "")
        )


def full_disk(folder: str | Path | None) -> str | None:
    """`its disk is full (N KiB free in FOLDER)` when a write into `folder` just failed for want of space;
    None otherwise. Said so because the error itself often hides it: a dying ffmpeg reaches us as a broken
    pipe, torch.save's as "unexpected pos"."""
    if folder is None:
        return None
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    return f"its disk is full ({free >> 10} KiB free in {folder})" if free < NEARLY_FULL_BYTES else None
