"""The loaded model's request limits, as the API process sees them without loading the model.

The worker leader publishes `pipe.limits` into the job store at startup (`describe`), in a plain form:
`{field: {"min", "max", "multiple_of", "default"}}`; a fixed (distilled) schedule adds its `timesteps` to
`num_inference_steps`, whose min and max are then its step count. The API checks each request against the
last published limits (`check`) and answers 422 naming the field and the allowed range. Until a worker has
published them (first start, model still loading) the API only checks types and sanity bounds; the worker
runs `pipe.validate` on every claimed job anyway, which turns anything the API could not check into a
failed job with the pipeline's own message. The prompts' limit is in tokens (`{"max_tokens"}`): the API
counts them with the model's tokenizer (`Services.check_prompts`). `image` says whether the model takes a
first-frame image (`required`: image-to-video, which then needs one; `optional`: text and image to video,
Wan2.2 TI2V-5B, with or without one; neither: a text-to-video model, which refuses one) and the server's image
limits (`max_bytes`, `max_pixels`, `formats`).
"""

from __future__ import annotations

import dataclasses

from dit.image import MEDIA_TYPES, ImageLimits

# Request fields, and the name each goes by in `dit.pipeline.Limits` (min_<key>, max_<key>, default_<key>).
_KEYS = {
    "num_frames": "frames",
    "height": "size",
    "width": "size",
    "num_inference_steps": "steps",
    "guidance_scale": "guidance",
    "fps": "fps",
}
_MULTIPLE = {"frames": "frame_step", "size": "size_multiple"}


def describe(limits, images: ImageLimits | None = None) -> dict:
    """`pipe.limits` → `{field: {"min", "max", "default", "multiple_of"?}}`, the multiple counted from the
    minimum (frames are frame_step·k + 1 and the minimum is one of them); `images`: the server's image
    limits (None: the defaults)."""
    raw = dataclasses.asdict(limits)
    out = {}
    for name, key in _KEYS.items():
        spec = {bound: raw[f"{bound}_{key}"] for bound in ("min", "max") if f"{bound}_{key}" in raw}
        default = raw.get(f"default_{name if key == 'size' else key}")  # default_height, default_width
        if key == "size" and raw.get("image_target_size"):
            default = None  # a request without a size takes the image's (HunyuanVideo-1.5 image-to-video)
        if default is not None:
            spec["default"] = default
        if raw.get(_MULTIPLE.get(key, "")):
            spec["multiple_of"] = raw[_MULTIPLE[key]]
        if key == "steps" and raw.get("schedule"):
            spec["timesteps"] = list(raw["schedule"]["timesteps"])
        if spec:
            out[name] = spec
    if raw.get(
        "two_experts"
    ):  # the low-noise expert's guidance: guidance_scale's range, its value by default
        out["guidance_scale_2"] = {k: v for k, v in out["guidance_scale"].items() if k != "default"}
    if "max_prompt_tokens" in raw:
        out["prompt"] = out["negative_prompt"] = {"max_tokens": raw["max_prompt_tokens"]}
    out["image"] = {
        "required": raw["image"],
        "optional": raw["image_optional"],
        **dataclasses.asdict(images or ImageLimits()),
        "formats": list(MEDIA_TYPES),
    }
    if raw.get("image_target_size"):  # a request with an image and no size: the size the family makes of it
        out["image"]["target_size"] = raw["image_target_size"]
    return out


def defaults(described: dict) -> dict:
    """The value a request gets for each field it leaves out."""
    return {name: spec["default"] for name, spec in described.items() if "default" in spec}


def fixed_steps(spec: dict) -> str:
    """What a published fixed schedule allows `num_inference_steps`, in words."""
    timesteps = ",".join(map(str, spec["timesteps"]))
    return f"the model's fixed schedule (timesteps {timesteps}) takes exactly {spec['min']} steps"


def image_rule(spec: dict) -> str:
    """What a published `image` entry of a model that takes one asks of a request, in words."""
    need = "required" if spec["required"] else "optional (without one the model generates from the text)"
    return (
        f"{need}: the model's first frame, {', '.join(spec['formats'])} of at most {spec['max_bytes']} "
        f"bytes and {spec['max_pixels']} pixels, as a data URL or in multipart/form-data a file part"
    )


def accepts_image(spec: dict) -> bool:
    return spec["required"] or spec.get("optional", False)  # limits published before `optional` lack it


def check(request: dict, limits: dict) -> list[tuple[str, str]]:
    """(field, message) for every value outside the published numeric limits, and for an image the model
    needs and did not get, or got and does not take."""
    errors = []
    for name, spec in limits.items():
        value = request.get(name)
        if value is None:
            continue
        lo, hi, mult = spec.get("min"), spec.get("max"), spec.get("multiple_of")
        allowed = f"allowed {lo}..{hi}" + (f" in steps of {mult}" if mult else "")
        if "timesteps" in spec and value != lo:
            errors.append(
                (name, f"{name}={value} is not valid: {fixed_steps(spec)}; send {lo} or leave it out")
            )
        elif (lo is not None and value < lo) or (hi is not None and value > hi):
            errors.append((name, f"{name}={value} is out of range: {allowed}"))
        elif mult and isinstance(value, int) and (value - (lo or 0)) % mult:
            errors.append((name, f"{name}={value} is not valid: {allowed}"))
    if request.get("guidance_scale_2") is not None and limits and "guidance_scale_2" not in limits:
        errors.append(("guidance_scale_2", "the model has one expert: guidance_scale_2 is for Wan2.2 A14B"))
    image, given = limits.get("image"), request.get("image") is not None
    if image is not None and image["required"] and not given:
        errors.append(("image", "the model generates from a first-frame image: send one (PNG, JPEG or WebP)"))
    elif image is not None and given and not accepts_image(image):
        errors.append(("image", "the model is text-to-video: it takes no image"))
    return errors
