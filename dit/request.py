"""A text-to-video request and its checks: the numbers (size, length, steps, guidance, fps, seed) against a
model's `Limits`, None ones filled with its defaults. It imports no model code: `dit.preflight` checks a
request with it before diffusers or transformers load; `Pipeline.validate` checks the rest (image, prompt,
experts)."""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dit.families import Limits

MAX_SEED = 2**63 - 1
MAX_LORA_STRENGTH = 4.0  # |strength| of a LoRA a request names


@dataclass
class GenerationRequest:
    """None fields take the model's defaults (`pipe.limits`)."""

    prompt: str
    negative_prompt: str = ""
    num_frames: int | None = None
    height: int | None = None
    width: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    # a two-expert model's guidance below its boundary (the low-noise expert's); None: its default
    guidance_scale_2: float | None = None
    seed: int | None = 0  # None: 0, as left out
    fps: int | None = None
    cache: str | None = None  # off | fbcache[:THRESHOLD] (dit.cache); None: the pipeline's
    # the first frame of an image-to-video model (optional for Wan2.2 TI2V-5B): RGB, a PIL image or uint8
    # [H, W, 3] of any size (resized to cover the request's size, aspect kept, and centre-cropped:
    # dit.image.fit); HunyuanVideo-1.5's takes its size from it when the request gives neither height nor
    # width (`Limits.image_target_size`)
    image: Any = None
    # LoRAs from the pipeline's catalogue (`PipelineConfig.lora_dir`, dit.lora_catalogue), applied to this
    # job alone: (name, strength) pairs, or [name, strength] lists as JSON gives them; validated into pairs
    # sorted by name (`check_loras`), the set's one spelling
    loras: tuple[tuple[str, float], ...] = ()


def plain_number(value):
    """numpy's numbers as Python's (np.int64 from `rng.integers`, np.float32): the checks take those, and a
    request keeps them so (JSON, checkpoint keys); anything else as it is."""
    if type(value) in (int, float) or isinstance(value, bool) or not isinstance(value, numbers.Real):
        return value
    return int(value) if isinstance(value, numbers.Integral) else float(value)


def _check_int(
    name: str, value, low: int, high: int, rule: str = "an integer", step: int = 1, offset: int = 0
):
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not low <= value <= high
        or (value - offset) % step
    ):
        raise ValueError(f"{name} must be {rule} between {low} and {high}, got {value!r}")


def check_guidance(name: str, g, lim: Limits) -> None:
    if isinstance(g, bool) or not isinstance(g, int | float) or not lim.min_guidance <= g <= lim.max_guidance:
        raise ValueError(f"{name} must be between {lim.min_guidance} and {lim.max_guidance}, got {g!r}")


def check_loras(loras) -> tuple[tuple[str, float], ...]:
    """A request's `loras` as (name, strength) pairs sorted by name; ValueError starting "loras" for what
    is not a list of [name, strength] pairs with distinct names and finite strengths in ±MAX_LORA_STRENGTH.
    Whether the names are in the catalogue and fit the model is `Pipeline.validate`'s to check."""
    if loras is None:
        return ()
    if isinstance(loras, str | bytes | dict) or not hasattr(loras, "__iter__"):
        raise ValueError(f"loras must be a list of [name, strength] pairs, got {loras!r}")
    pairs = []
    for pair in loras:
        if isinstance(pair, str | bytes | dict) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ValueError(f"loras: each must be a [name, strength] pair, got {pair!r}")
        name, strength = pair[0], plain_number(pair[1])
        if not isinstance(name, str) or not name:
            raise ValueError(f"loras: a name must be a non-empty string, got {name!r}")
        if (
            isinstance(strength, bool)
            or not isinstance(strength, int | float)
            or not math.isfinite(strength)
            or abs(strength) > MAX_LORA_STRENGTH
        ):
            raise ValueError(
                f"loras: {name}'s strength must be a number between {-MAX_LORA_STRENGTH} and "
                f"{MAX_LORA_STRENGTH}, got {strength!r}"
            )
        pairs.append((name, float(strength)))
    names = [name for name, _ in pairs]
    if len(set(names)) < len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise ValueError(f"loras: {', '.join(twice)} named more than once")
    return tuple(sorted(pairs))


# A regular expression's character class of what a blank prompt holds: Python's whitespace (str.isspace),
# Unicode's default-ignorable characters (zero-width spaces and joiners, the byte order mark, direction
# marks, the soft hyphen, variation selectors, Hangul fillers) and the blank braille pattern, as a copy from
# a web page brings them; a prompt of these alone is empty to the model. The Basic Multilingual Plane's
# only: the OpenAPI pattern's regex dialects share no escape past it.
BLANK_CLASS = (
    r"\t-\r\x1c-\x20\x85\xa0\xad\u034f\u061c\u115f\u1160\u1680\u17b4\u17b5\u180b-\u180f\u2000-\u200f"
    r"\u2028-\u202f\u205f-\u206f\u2800\u3000\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8"
)
_BLANK = re.compile(rf"[{BLANK_CLASS}]*")


def blank(text: str) -> bool:
    """Whether `text` reads as empty: nothing but whitespace and invisible characters (`BLANK_CLASS`)."""
    return _BLANK.fullmatch(text) is not None


def check_text(name: str, value: str) -> None:
    """ValueError naming the field when `value` has no UTF-8 form (a lone UTF-16 surrogate, as JSON's
    "\\ud800" gives): such text can be neither tokenized nor stored."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid text: it holds a lone UTF-16 surrogate") from None


def guided(guidance_scale, guidance_scale_2=None) -> bool:
    """Whether a run makes the negative prompt's pass: a guidance other than 1 (either expert's; None for the
    low-noise expert's: the same as the other's)."""
    return guidance_scale != 1 or guidance_scale_2 not in (None, 1)


def unused_negative_prompt(negative_prompt, guidance_scale, guidance_scale_2=None) -> list[str]:
    """One line when a negative prompt is given that the run leaves out (it was dropped in silence)."""
    if isinstance(negative_prompt, str) and not blank(negative_prompt) and guidance_scale is not None:
        if not guided(guidance_scale, guidance_scale_2):
            return ["the negative prompt is unused: guidance 1 runs no pass with it (above 1 does)"]
    return []


def check_prompts(req: GenerationRequest) -> GenerationRequest:
    """The prompt (a string that is not blank) and the negative prompt (None: none), each valid text;
    ValueError naming the field. Their length in tokens needs the model's tokenizer: `Pipeline.validate`."""
    if not isinstance(req.prompt, str) or blank(req.prompt):
        raise ValueError("prompt must be a non-empty string (not only spaces or invisible characters)")
    if req.negative_prompt is None:  # the field's default: none
        req = replace(req, negative_prompt="")
    if not isinstance(req.negative_prompt, str):
        raise ValueError(f"negative_prompt must be a string, got {type(req.negative_prompt).__name__}")
    for name in ("prompt", "negative_prompt"):
        check_text(name, getattr(req, name))
    return req


def check_numbers(req: GenerationRequest, lim: Limits, *, planned: bool = False) -> GenerationRequest:
    """The request's size, length, steps, guidance, fps and seed: None ones the model's defaults, each
    checked against `lim` (ValueError naming the field), whether it has the image the model needs or takes
    none (`planned`: a video's size alone, as `ithaca plan` asks, needs none), and its `loras` as
    `check_loras` spells them. What `Pipeline.validate` checks first, and all `dit.preflight` can check
    before the model loads."""
    numbers_ = ("num_frames", "height", "width", "num_inference_steps", "guidance_scale", "guidance_scale_2",
                "fps", "seed")  # fmt: skip
    req = replace(req, **{name: plain_number(getattr(req, name)) for name in numbers_})
    req = replace(
        req,
        num_frames=lim.default_frames if req.num_frames is None else req.num_frames,
        height=lim.default_height if req.height is None else req.height,
        width=lim.default_width if req.width is None else req.width,
        num_inference_steps=lim.default_steps if req.num_inference_steps is None else req.num_inference_steps,
        guidance_scale=lim.default_guidance if req.guidance_scale is None else req.guidance_scale,
        fps=lim.default_fps if req.fps is None else req.fps,
        seed=0 if req.seed is None else req.seed,  # the field's default
        loras=check_loras(req.loras),
    )
    step, mult = lim.frame_step, lim.size_multiple
    _check_int(
        "num_frames", req.num_frames, lim.min_frames, lim.max_frames, f"{step}k+1", step=step, offset=1
    )
    bad = []  # both named when both are wrong
    for name in ("height", "width"):
        try:
            _check_int(name, getattr(req, name), lim.min_size, lim.max_size, step=mult)
        except ValueError:
            bad.append(name)
    if bad:
        got = " and ".join(repr(getattr(req, name)) for name in bad)
        multiple = f"a multiple of {mult}" if len(bad) == 1 else f"multiples of {mult}"
        raise ValueError(
            f"{' and '.join(bad)} must be {multiple} between {lim.min_size} and {lim.max_size}, got {got}"
        )
    if lim.schedule is not None and req.num_inference_steps != lim.schedule.steps:
        raise ValueError(
            f"num_inference_steps must be {lim.schedule.steps}: the model's fixed schedule (timesteps "
            f"{lim.schedule}) takes exactly that many, got {req.num_inference_steps!r}"
        )
    _check_int("num_inference_steps", req.num_inference_steps, lim.min_steps, lim.max_steps)
    _check_int("fps", req.fps, lim.min_fps, lim.max_fps)
    _check_int("seed", req.seed, 0, MAX_SEED)
    check_guidance("guidance_scale", req.guidance_scale, lim)
    if not lim.two_experts and req.guidance_scale_2 is not None:  # before any rank starts (`dit.preflight`)
        raise ValueError("guidance_scale_2 is for two-expert models (Wan2.2 A14B); this model has one")
    if lim.image and req.image is None and not planned:
        raise ValueError("image: this image-to-video model needs a first-frame image")
    if not (lim.image or lim.image_optional) and req.image is not None:
        raise ValueError("image: this text-to-video model takes no image")
    return req
