"""The tiny model's visual language: "a {color} {shape} moving {direction}" and the caption variants it is
trained on. A clip is one `Scene`; `caption` words it, `scene_from` parses the canonical form back."""

from __future__ import annotations

import random
from dataclasses import dataclass

# RGB of each colour word: far apart in hue and brightness, so the detector tells them apart after the VAE.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 245),
    "yellow": (240, 220, 40),
    "white": (240, 240, 240),
    "purple": (170, 60, 220),
}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = ("left", "right", "up", "down")
SIZES = ("small", "big")

# Synonyms a caption may use instead of the canonical word (rendered the same).
SYNONYMS = {"circle": ("ball", "disc"), "square": ("box",), "purple": ("violet",)}
VERBS = ("moving", "going", "sliding", "travelling")

# Never rendered for training: the model must compose them from what it saw (each colour, shape and
# direction, and each pair of them, still appears in other combinations).
HELD_OUT = frozenset(
    {
        ("red", "triangle", "up"),
        ("green", "circle", "left"),
        ("blue", "square", "down"),
        ("yellow", "triangle", "right"),
        ("white", "square", "up"),
        ("purple", "circle", "right"),
    }
)


@dataclass(frozen=True)
class Scene:
    color: str
    shape: str
    direction: str
    size: str | None = None  # None: a size between small and big

    @property
    def combo(self) -> tuple[str, str, str]:
        return self.color, self.shape, self.direction

    @property
    def prompt(self) -> str:
        """The canonical prompt of the language."""
        return f"a {self.color} {self.shape} moving {self.direction}"


def all_scenes() -> list[Scene]:
    """The 72 colour × shape × direction combinations, in a fixed order."""
    return [Scene(c, s, d) for c in COLORS for s in SHAPES for d in DIRECTIONS]


def training_scenes() -> list[Scene]:
    return [s for s in all_scenes() if s.combo not in HELD_OUT]


def _word(word: str, rng: random.Random, p: float = 0.3) -> str:
    options = SYNONYMS.get(word)
    return rng.choice(options) if options and rng.random() < p else word


def caption(scene: Scene, rng: random.Random) -> str:
    """One of the caption variants of `scene`: articles, verbs, "to the", synonyms and sizes vary, so the
    model reads words rather than fixed strings. Half of them are the canonical form."""
    color, shape = _word(scene.color, rng), _word(scene.shape, rng)
    size = f"{scene.size} " if scene.size else ""
    if rng.random() < 0.5 and not size:
        return f"a {color} {shape} moving {scene.direction}"
    article = rng.choice(("a ", "the ", "one ", ""))
    verb = rng.choice(VERBS)
    where = rng.choice(("", "to the ")) if scene.direction in ("left", "right") else ""
    return f"{article}{size}{color} {shape} {verb} {where}{scene.direction}"


def vocabulary() -> list[str]:
    """Every word a caption can hold (the tokenizer's word list)."""
    words = {"a", "the", "one", "to", "moving", *VERBS, *SIZES, *COLORS, *SHAPES, *DIRECTIONS}
    words |= {w for options in SYNONYMS.values() for w in options}
    return sorted(words)


def declared_vocabulary() -> dict:
    """What the model folder declares in `vocabulary.json` (dit.vocabulary): the words, and in one phrase
    what they draw."""
    choice = lambda words: "{" + "|".join(words) + "}"  # noqa: E731
    canonical = f"a {choice(COLORS)} {choice(SHAPES)} moving {choice(DIRECTIONS)}"
    return {"about": f'coloured shapes moving on black, "{canonical}"', "words": vocabulary()}
