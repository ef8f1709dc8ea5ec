"""A pipeline folder's parts as files, checked before anything loads them: every part `model_index.json`
names is there, its JSON reads and its safetensors files hold what their headers list. Torch-free: the
launcher checks before any rank starts, and the API process resolving a Hub name checks its snapshot."""

from __future__ import annotations

import json
from pathlib import Path

from dit.files import link_to_nowhere


def read_json(path: Path) -> dict:
    """A config file's JSON object; ValueError naming the file when it is not JSON, or JSON of another kind
    (`[]` broke its reader with an AttributeError)."""
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path} is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object: it holds {type(data).__name__} {str(data)[:40]}")
    return data


# What the families' loaders read of a folder: its index, and the parts a pipeline of theirs has
_PARTS = ("model_index.json", "transformer", "transformer_2", "vae", "text_encoder", "text_encoder_2",
          "tokenizer", "tokenizer_2", "image_encoder", "image_processor", "scheduler")  # fmt: skip
# A part whose weights the loader reads from *.safetensors files
_WEIGHTS = ("transformer", "transformer_2")


def check_parts(folder: Path) -> None:
    """ValueError unless a pipeline folder holds every part its `model_index.json` names, and its
    transformers their weights: the loader would otherwise put the tiny random VAE or text encoder in the
    place of a missing one, and make noise, or a video that ignores its prompt. Each part's JSON files must
    read and its safetensors files hold what their headers list, named when not: a part only the replica
    leader loads (the text encoder, the image encoder) broke only that rank, and the others said so in a
    collective's traceback."""
    for part in _PARTS:  # linked in (the few-step recipe) to nowhere: as absent, the stand-ins in its place
        if said := link_to_nowhere(folder / part):
            raise ValueError(said)
    index = folder / "model_index.json"
    if not index.is_file():  # a transformer folder alone, or its parts linked in
        return
    named = read_json(index)
    missing = [
        f"{part}/"
        for part, spec in named.items()
        if not part.startswith("_") and isinstance(spec, list) and spec[0] is not None
        if not (folder / part).is_dir()
    ]
    if missing:
        raise ValueError(
            f"model_index.json names {' and '.join(missing)}, which the folder lacks: copy the whole "
            "pipeline folder"
        )
    for part in _WEIGHTS:
        if (folder / part).is_dir() and not any((folder / part).glob("*.safetensors")):
            raise ValueError(f"{part}/ holds no *.safetensors weights: copy the whole pipeline folder")
    parts = [folder / part for part in named if not part.startswith("_") and (folder / part).is_dir()]
    for path in sorted(p for part in parts for p in part.iterdir()):
        if path.suffix == ".json":
            read_json(path)
        elif path.suffix == ".safetensors":
            _check_safetensors(path)


def _check_safetensors(path: Path) -> None:
    """ValueError naming a file that is not safetensors, or holds less data than its header lists (cut short
    in a copy). Reads the header alone: torch-free and quick, before any rank starts."""
    size = path.stat().st_size
    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little") if size >= 8 else -1
        try:
            header = json.loads(f.read(length)) if 0 < length <= size - 8 else None
        except ValueError:
            header = None
    try:
        ends = [int(entry["data_offsets"][1]) for key, entry in header.items() if key != "__metadata__"]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):  # no header, or not of tensors
        ends = None
    if ends is None:
        raise ValueError(f"{path} is not a readable safetensors file (its header does not read)")
    needed = 8 + length + max(ends, default=0)
    if size < needed:
        raise ValueError(f"{path} is cut short ({size} of its {needed} bytes): copy it again")
