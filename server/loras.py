"""The LoRAs a request names (`ithaca serve --lora-dir`): both APIs' `loras` field, `[{"name", "strength"}]`.

The worker leader publishes the catalogue (`Pipeline.lora_catalogue`'s entries: name, experts, fits, error;
None without --lora-dir) with its limits; the API lists it (`GET /loras`, `GET /limits`), checks a request's
names against it (`check`: 422 naming `loras`) and describes the names in the OpenAPI document
(`describe`). A job's spec carries its set as `[[name, strength], ...]`, the form `GenerationRequest` takes.

In a form (multipart or urlencoded) a `loras` part is JSON: one object, or an array of them (several parts
add up); /v1/videos also reads the official SDK's `extra_body={"loras": [...]}`, which it flattens to
`loras[][name]` and `loras[][strength]` fields (`form_items`).
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from dit.request import MAX_LORA_STRENGTH
from server.jsonsafe import shown

MAX_LORAS = 16  # per request: a sanity bound (a switch merges each one)
FIELD = "loras"
_BRACKETS = "loras[]["  # the SDK's flattening: loras[][name], loras[][strength]
DESCRIPTION = (
    "LoRAs from the server's catalogue (GET /loras), each at a strength (default 1), applied to this job "
    "alone; names distinct"
)


class LoraItem(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=512, description="a name GET /loras lists")
    strength: float = Field(1.0, ge=-MAX_LORA_STRENGTH, le=MAX_LORA_STRENGTH, allow_inf_nan=False)


LoraList = list[LoraItem]
_ITEMS = TypeAdapter(LoraList)


def as_spec(items: list[LoraItem] | None) -> list[list] | None:
    """A request's LoRAs as its job's spec holds them, sorted by name as `validate` sorts the set (so a retry
    naming them in another order is the same request to its Idempotency-Key); None for none (the spec leaves
    `loras` out)."""
    return sorted([item.name, item.strength] for item in items) if items else None


def parse(value, *, strict: bool) -> list[list] | None:
    """`loras` of a request read without a model (/v1/videos) as `as_spec` gives it; ValueError naming the
    item and what is wrong."""
    try:
        items = _ITEMS.validate_python(value, strict=strict)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise ValueError(f"{FIELD}{where}: {first['msg']}") from None
    if len(items) > MAX_LORAS:
        raise ValueError(f"{FIELD}: {len(items)} LoRAs; at most {MAX_LORAS} are accepted")
    return as_spec(items)


def form_items(items: list[tuple[str, object]]) -> tuple[list[tuple[str, object]], list | None]:
    """A form's fields without its LoRA parts, and those as a list of objects (None: there were none): each
    `loras` part JSON (an object or an array of them), then the SDK's `loras[][KEY]` fields
    (`_bracket_objects`). Text that is no such JSON stays text: the validation names it. ValueError for
    bracket fields whose objects cannot be told apart."""
    rest, loras, brackets = [], [], []
    for key, value in items:
        if key == FIELD:
            loras.extend(_json_objects(value))
        elif key.startswith(_BRACKETS) and key.endswith("]"):
            brackets.append((key[len(_BRACKETS) : -1], value))
        else:
            rest.append((key, value))
    loras += _bracket_objects(brackets)
    return rest, loras if loras else None


def _bracket_objects(fields: list[tuple[str, object]]) -> list[dict]:
    """`loras[][KEY]` fields as objects. `qs` writes each object's keys together (a key the current object
    has starts the next one); the openai SDK writes every name, then every strength, and those were paired
    wrongly (the second LoRA took the first's strength). Fields whose every key comes in one run are paired by
    position, and refused where the runs differ in length: which LoRA a strength is for cannot be told."""
    keys = [key for key, _ in fields]
    runs = [key for i, key in enumerate(keys) if i == 0 or keys[i - 1] != key]
    if len(runs) == len(set(runs)) < len(keys):  # grouped by key
        columns = {key: [value for k, value in fields if k == key] for key in runs}
        counts = {len(column) for column in columns.values()}
        if len(counts) > 1:
            said = " and ".join(f"{len(columns[key])} {key}" for key in runs)
            raise ValueError(
                f"the form's {FIELD}[][...] fields give {said}: which LoRA each is for cannot be told; give "
                f"every LoRA each field, or send {FIELD} as one JSON part "
                f'(the openai SDK: extra_body={{"{FIELD}": json.dumps([...])}})'
            )
        return [{key: columns[key][i] for key in runs} for i in range(counts.pop())]
    objects: list[dict] = []
    for key, value in fields:
        if not objects or key in objects[-1]:
            objects.append({})
        objects[-1][key] = value
    return objects


def _json_objects(value) -> list:
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return [value]
    return parsed if isinstance(parsed, list) else [parsed if isinstance(parsed, dict) else value]


def check(loras: list[list] | None, info: dict) -> list[tuple[str, str]]:
    """(field, message) for a request's LoRAs the published catalogue refuses: any LoRA on a server without
    one, a name it does not list, one whose files do not fit the model, a name given twice. Nothing before
    a worker published (the worker's own validation then fails the job)."""
    if not loras or "limits" not in info:
        return []
    catalogue = info.get(FIELD)
    if catalogue is None:
        return [(FIELD, "this server has no LoRA catalogue: it was started without --lora-dir")]
    entries = {entry["name"]: entry for entry in catalogue}
    errors, seen = [], set()
    for name, _ in loras:
        entry = entries.get(name)
        if name in seen:
            errors.append((FIELD, f"{shown(name)} is named more than once"))
        elif entry is None:
            errors.append((FIELD, f"no LoRA named {shown(name)}; GET /loras lists the {len(entries)} known"))
        elif not entry["fits"]:
            errors.append((FIELD, f"{shown(name)} does not fit the model: {entry['error']}"))
        seen.add(name)
    return errors


def describe(item_schema: dict, catalogue) -> dict | None:
    """The `loras` array's schema with the names of the published catalogue (those that fit), or None when
    no request may name any (no catalogue, or none fits): the field is then left out of the document."""
    names = [entry["name"] for entry in catalogue or () if entry["fits"]]
    if not names:
        return None
    item = item_schema | {"properties": item_schema["properties"] | {"name": {"enum": names}}}
    return {
        "type": "array",
        "items": item,
        "maxItems": min(MAX_LORAS, len(names)),
        "description": DESCRIPTION,
    }
