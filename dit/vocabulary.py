"""A model's declared vocabulary: the words a small model was trained on, in `vocabulary.json` beside its
`model_index.json` (`{"about": one sentence on what it draws, "words": [...]}`; the trained tiny model ships
one). A prompt with words outside it comes back as a blur, so `prompt_warnings` says so; a model that
declares none (every real one) is never warned about."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dit.presets import resolve

FILE = "vocabulary.json"
_WORD = re.compile(r"\w+")  # what the tiny model's word-level tokenizer splits a prompt into (lowercased)


def read_vocabulary(model: str | Path) -> dict | None:
    """`{"about", "words"}` of a shipped model's name or a pipeline folder that declares one; else None."""
    path = Path(resolve(model)) / FILE
    if not path.is_file():
        return None
    declared = json.loads(path.read_text())
    return {"about": str(declared["about"]), "words": sorted(str(w).lower() for w in declared["words"])}


def unknown_words(prompt: str, vocabulary: dict) -> list[str]:
    """The prompt's words outside the vocabulary, in order, each once."""
    known = set(vocabulary["words"])
    return list(dict.fromkeys(w for w in _WORD.findall(prompt.lower()) if w not in known))


def prompt_warnings(prompt: str | None, vocabulary: dict | None) -> list[str]:
    """One line when the prompt uses words the model does not know (none without a declared vocabulary)."""
    unknown = unknown_words(prompt or "", vocabulary) if vocabulary else []
    if not unknown:
        return []
    return [
        f"the model does not know the words {', '.join(unknown)}: it draws {vocabulary['about']}, "
        f"from the words {' '.join(vocabulary['words'])}"
    ]
