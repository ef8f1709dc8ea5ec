"""What a client can send, as a new user or an attacker would: text that UTF-8 cannot encode, non-finite and
oversized numbers, deep JSON, loose formats, wrong media types, a reused Idempotency-Key, and a job store
another process keeps locked. In-process (the ASGI app, no worker group): the tiny model's limits are
published into the store as a worker would."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sqlite3
import threading
import time

import httpx
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from dit.pipeline import TINY_LIMITS
from dit.vocabulary import read_vocabulary
from server import limits
from server.app import create_app
from server.config import ServeConfig
from server.store import JobStore

MAX_TOKENS = 128  # the random tiny preset's byte tokenizer (a token per byte: long prompts are cheap to make)
NUMBERS = ("num_frames", "height", "width", "num_inference_steps", "guidance_scale", "seed", "fps")


def _publish(store: JobStore, vocabulary: dict | None = None) -> None:
    described = limits.describe(dataclasses.replace(TINY_LIMITS, max_prompt_tokens=MAX_TOKENS))
    info = {"limits": described, "defaults": limits.defaults(described), "model": "tiny-random"}
    info["vocabulary"] = vocabulary
    store.heartbeat("test/g/replica0", instance="test", group_id="g", state="ready", info=info)


def _app(tmp_path, vocabulary: dict | None = None, **settings_):
    config = ServeConfig(workers=False, data_dir=str(tmp_path), preset="tiny-random", **settings_)
    app = create_app(config)
    _publish(app.state.services.store, vocabulary)
    return app


@pytest.fixture
def client(tmp_path):
    with TestClient(_app(tmp_path), raise_server_exceptions=False) as c:
        yield c


def _raw(client, path: str, body: bytes, content_type: str = "application/json", **headers):
    return client.post(path, content=body, headers={"content-type": content_type, **headers})


def _field(r) -> str:
    """The field a 422 names, in either shape."""
    body = r.json()
    return body["error"]["param"] if "error" in body else body["detail"][0]["loc"][-1]


# -- 1. text that cannot be encoded ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,body,field",
    [
        ("/generate", b'{"prompt": "\\ud800 fox"}', "prompt"),
        ("/generate", b'{"prompt": "fox", "negative_prompt": "\\udfff"}', "negative_prompt"),
        ("/generate", b'{"prompt": "fox", "\\ud800": 1}', None),  # a field name: no field to name
        ("/v1/videos", b'{"prompt": "\\ud800 fox"}', "prompt"),
        ("/v1/videos", b'{"prompt": "fox", "model": "m\\ud800"}', "model"),
        ("/v1/videos", b'{"prompt": "fox", "size": "832x480\\ud800"}', "size"),
        ("/v1/videos", b'{"prompt": "fox", "seconds": "4\\ud800"}', "seconds"),
        ("/v1/videos", b'{"prompt": "fox", "\\ud800": 1}', None),
        ("/v1/videos", b'{"prompt": "fox\\u0000"}', "prompt"),
    ],
)
def test_text_that_cannot_be_encoded_is_refused_naming_the_field(client, path, body, field):
    r = _raw(client, path, body)
    assert r.status_code == 422 and field in (None, _field(r)), r.text
    assert client.get("/jobs").json()["data"] == [] and client.get("/v1/videos").status_code == 200


def test_utf7_form_cannot_smuggle_a_surrogate(client):
    """A form body decoded in a charset that makes lone surrogates (UTF-7) meets the same door."""
    r = client.post(
        "/v1/videos", content=b"prompt=%2B2AA-", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code in (200, 422)  # urlencoded is read as UTF-8/latin-1: no surrogate can appear
    form = b'--B\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n+2AA-\r\n--B--\r\n'
    r = _raw(client, "/v1/videos", form, "multipart/form-data; charset=utf-7; boundary=B")
    assert r.status_code in (200, 422) and client.get("/v1/videos").status_code == 200


def test_reads_survive_a_stored_lone_surrogate(client, tmp_path):
    """A row an earlier version stored (json.dumps escapes the surrogate, json.loads brings it back)."""
    db = sqlite3.connect(tmp_path / "jobs.db")
    with db:
        db.execute(
            "INSERT INTO jobs (id, status, spec, meta, created_at, finished_at, error) "
            "VALUES (?, 'failed', ?, ?, 1.0, 2.0, 'boom')",
            ("ab" * 16, json.dumps({"prompt": "\ud800 fox"}), json.dumps({"model": "m\udfff"})),
        )
    db.close()
    for path in (
        "/jobs",
        "/jobs?status=failed",
        f"/jobs/{'ab' * 16}",
        "/v1/videos",
        f"/v1/videos/{'ab' * 16}",
    ):
        r = client.get(path)
        assert r.status_code == 200, (path, r.text)
        assert "\ufffd fox" in r.text
    with client.stream("GET", f"/jobs/{'ab' * 16}/events") as r:
        text = r.read().decode()
    assert r.status_code == 200 and "event: done" in text and "\ufffd fox" in text


# -- 2. non-finite and oversized numbers, deep JSON, handlers that never raise ------------------------


@pytest.mark.parametrize("field", NUMBERS)
@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity", b"1" + b"0" * 400])
def test_non_finite_and_huge_numbers_on_generate(client, field, value):
    r = _raw(client, "/generate", b'{"prompt": "fox", "%s": %s}' % (field.encode(), value))
    assert r.status_code == 422 and _field(r) == field, r.text


@pytest.mark.parametrize(
    "value", [b"NaN", b"Infinity", b"-1e999", b"1" + b"0" * 400, b"true", b'"nan"', b'"inf"']
)
def test_bad_seconds_on_v1(client, value):
    r = _raw(client, "/v1/videos", b'{"prompt": "fox", "seconds": %s}' % value)
    assert r.status_code == 422 and _field(r) == "seconds", r.text


@pytest.mark.parametrize("path", ["/generate", "/v1/videos"])
def test_deeply_nested_or_undecodable_json(client, path):
    for body in (b'{"prompt": "fox", "seconds": ' + b"[" * 1000 + b"]" * 1000 + b"}", b"\x80", b"\0" * 9):
        r = _raw(client, path, body)
        assert r.status_code in (400, 422) and r.headers["content-type"] == "application/json", r.text


def test_an_unexpected_error_is_a_json_500_in_the_route_shape(client, monkeypatch):
    def broken(job_id):
        raise RuntimeError("bug")

    monkeypatch.setattr(client.app.state.services, "job", broken)
    assert client.get(f"/jobs/{'a' * 32}").json() == {"detail": "internal server error"}
    r = client.get(f"/v1/videos/{'a' * 32}")
    assert r.status_code == 500 and r.json()["error"]["type"] == "api_error"


# -- 3. loose validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/generate", "/v1/videos"])
def test_prompt_rules_are_the_same_on_both_routes(client, path):
    blank = client.post(path, json={"prompt": "  \n\t "})
    assert blank.status_code == 422 and _field(blank) == "prompt"
    long = client.post(path, json={"prompt": "x" * 60_000})
    assert long.status_code == 422 and _field(long) == "prompt"
    over = client.post(path, json={"prompt": "x" * MAX_TOKENS})  # 128 bytes + end token
    assert over.status_code == 422 and _field(over) == "prompt" and f"at most {MAX_TOKENS}" in over.text
    assert client.post(path, json={"prompt": "x" * (MAX_TOKENS - 1)}).status_code in (200, 202)


def test_negative_prompt_tokens_are_counted(client):
    r = client.post("/generate", json={"prompt": "fox", "negative_prompt": "y" * 200})
    assert r.status_code == 422 and _field(r) == "negative_prompt" and f"at most {MAX_TOKENS}" in r.text


@pytest.mark.parametrize(
    "fields,field",
    [
        ({"model": "m" * 60_000}, "model"),
        ({"model": 3}, "model"),
        ({"size": "832x480\n"}, "size"),
        ({"size": "８３２x480"}, "size"),  # fullwidth digits: `\d` matches them
        ({"size": "٨٣٢x480"}, "size"),
        ({"size": 832}, "size"),
        ({"seconds": True}, "seconds"),
        ({"seconds": "٤"}, "seconds"),
        ({"seconds": "4\n"}, "seconds"),
        ({"seconds": "1_0"}, "seconds"),
    ],
)
def test_loose_v1_fields_are_refused(client, fields, field):
    r = client.post("/v1/videos", json={"prompt": "fox"} | fields)
    assert r.status_code == 422 and _field(r) == field, r.text


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/xml", "", "application/x-www-form-urlencoded"]
)
def test_generate_takes_json_only(client, content_type):
    r = _raw(client, "/generate", b'{"prompt": "fox"}', content_type)
    assert r.status_code == 415, r.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", ""])
def test_v1_takes_json_and_forms_only(client, content_type):
    r = _raw(client, "/v1/videos", b'{"prompt": "fox"}', content_type)
    assert r.status_code == 415 and r.json()["error"]["type"] == "invalid_request_error", r.text
    assert client.post("/v1/videos", data={"prompt": "fox", "seconds": "1"}).status_code == 200
    assert client.post("/v1/videos", files={"prompt": (None, "fox")}).status_code == 200


# -- 4. idempotency ------------------------------------------------------------------------------------------


def test_idempotency_key_conflict_scope_and_reuse_after_delete(client):
    key = {"Idempotency-Key": "k-1"}
    first = client.post("/generate", json={"prompt": "fox"}, headers=key)
    again = client.post("/generate", json={"prompt": "fox"}, headers=key)
    assert first.status_code == again.status_code == 202 and first.json()["id"] == again.json()["id"]
    other = client.post("/generate", json={"prompt": "cat"}, headers=key)
    assert other.status_code == 409 and first.json()["id"] in other.json()["detail"]

    v1 = client.post("/v1/videos", json={"prompt": "fox"}, headers=key)  # another route family: another job
    assert v1.status_code == 200 and v1.json()["id"] != first.json()["id"]
    conflict = client.post("/v1/videos", json={"prompt": "cat"}, headers=key)
    assert conflict.status_code == 409 and conflict.json()["error"]["type"] == "invalid_request_error"
    assert client.delete(f"/v1/videos/{v1.json()['id']}").status_code == 200
    reused = client.post("/v1/videos", json={"prompt": "cat"}, headers=key)  # free again once deleted
    assert reused.status_code == 200 and reused.json()["id"] != v1.json()["id"]


def test_a_store_from_an_earlier_version_gains_the_hash_column(tmp_path):
    path = str(tmp_path / "jobs.db")
    old = JobStore(path)
    job, _ = old.create({"prompt": "fox"}, idempotency_key="generate:k")
    old.close()
    db = sqlite3.connect(path)
    db.execute("ALTER TABLE jobs DROP COLUMN request_hash")  # as an earlier version created it
    db.close()
    store = JobStore(path)
    assert store.create({"prompt": "fox"}, idempotency_key="generate:k") == (store.get(job.id), False)
    assert store.create({"prompt": "a"}, idempotency_key="generate:n", request_hash="h")[1]


# -- 5. the OpenAPI document ---------------------------------------------------------------------------------


def test_openapi_tells_the_truth(client):
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    body = paths["/v1/videos"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data", "application/x-www-form-urlencoded"} <= set(body)
    for path, method, codes in [
        ("/generate", "post", {"400", "401", "409", "413", "415", "422", "429", "503"}),
        ("/v1/videos", "post", {"400", "401", "409", "413", "415", "422", "429", "503"}),
        ("/jobs/{job_id}", "get", {"401", "404", "503"}),
        ("/jobs/{job_id}", "delete", {"401", "404", "409", "503"}),
        ("/v1/videos/{video_id}", "get", {"401", "404", "503"}),
    ]:
        assert codes <= set(paths[path][method]["responses"]), (path, method)
    for path in ("/jobs/{job_id}/video", "/v1/videos/{video_id}/content"):
        assert "video/mp4" in paths[path]["get"]["responses"]["200"]["content"]
    assert "text/event-stream" in paths["/jobs/{job_id}/events"]["get"]["responses"]["200"]["content"]
    fields = doc["components"]["schemas"]["GenerateBody"]["properties"]
    frames = next(b for b in fields["num_frames"]["anyOf"] if b.get("type") == "integer")
    assert frames["maximum"] == TINY_LIMITS.max_frames and frames["minimum"] == TINY_LIMITS.min_frames
    assert f"at most {MAX_TOKENS} tokens" in fields["prompt"]["description"]
    assert client.head("/health").status_code == 200


def test_schema_fuzzing(tmp_path):
    """Every operation of the app's own OpenAPI, positive and negative examples, under every schemathesis
    check: no 5xx, every reply one the document declares (status, media type, body schema), every request
    the document calls valid taken and every invalid one refused. Bounded: a fixed number of examples."""
    app = _app(tmp_path, max_queue=10_000)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    start, count = time.monotonic(), 0
    for result in schema.get_all_operations():
        strategy = st.one_of(*(result.ok().as_strategy(mode) for mode in GenerationMode))

        @settings(
            max_examples=40,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(strategy)
        def run(case):
            nonlocal count
            count += 1
            case.call_and_validate()

        run()
    print(f"schema fuzzing: {count} requests in {time.monotonic() - start:.1f} s")
    assert count > 300
    # a job's Server-Sent Events (the examples' ids find no job): each event as the document declares it
    with TestClient(app) as client:
        job_id = client.post("/generate", json={"prompt": "fox"}).json()["id"]
        client.delete(f"/jobs/{job_id}")  # cancelled: the stream ends with its `done`
        events = schema["/jobs/{job_id}/events"]["GET"].Case(path_parameters={"job_id": job_id})
        response = events.call_and_validate()
        assert response.text.count("event: done") == 1


def test_a_405_names_every_method_of_the_path(client):
    paths = client.get("/openapi.json").json()["paths"]
    for path, operations in paths.items():
        url = path.replace("{job_id}", "a" * 32).replace("{video_id}", "a" * 32)
        r = client.request("PATCH", url)
        assert r.status_code == 405, (path, r.text)
        assert set(r.headers["allow"].split(", ")) == {method.upper() for method in operations}, path


def test_a_video_answers_head(client, tmp_path):
    store = client.app.state.services.store
    job, _ = store.create({"prompt": "fox"})
    store.claim("w", "box")
    (tmp_path / "videos").mkdir(exist_ok=True)
    (tmp_path / "videos" / f"{job.id}.mp4").write_bytes(b"mp4" * 100)
    store.finish(job.id, "w", "completed", video=f"{job.id}.mp4")
    for url in (f"/jobs/{job.id}/video", f"/v1/videos/{job.id}/content"):
        r = client.head(url)
        assert r.status_code == 200 and r.headers["content-length"] == "300" and r.content == b"", url
        assert r.headers["content-type"] == "video/mp4" and client.get(url).content == b"mp4" * 100
    assert client.head(f"/jobs/{'b' * 32}/video").status_code == 404


def test_the_document_describes_what_the_routes_take(client):
    """A form has no null; a text-to-video model's bodies have no image; /v1's seconds and size patterns
    take exactly what the route does."""
    doc = client.get("/openapi.json").json()
    body = doc["paths"]["/generate"]["post"]["requestBody"]["content"]
    form = doc["components"]["schemas"][body["multipart/form-data"]["schema"]["$ref"].split("/")[-1]]
    assert "null" not in json.dumps(form) and "image" not in form["properties"]
    assert "image" not in doc["components"]["schemas"]["GenerateBody"]["properties"]
    for media in doc["paths"]["/v1/videos"]["post"]["requestBody"]["content"].values():
        assert set(media["schema"]["properties"]) == {"prompt", "model", "seconds", "size"}
    fields = doc["paths"]["/v1/videos"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    seconds, size = (re.compile(fields["properties"][name]["pattern"]) for name in ("seconds", "size"))
    texts = [f"{n}" for n in range(0, 4000, 41)] + ["0.0", "0.000001", "3600", "3600.0", "3600.000001"]
    texts += ["3599.999999", "0001", ".5", "1e3", "12.5", "4000", "٤"]
    for text in texts:
        r = client.post("/v1/videos", data={"prompt": "fox", "seconds": text})
        assert (r.status_code != 422) == bool(seconds.fullmatch(text)), (text, r.text)
    for text in ("0x480", "832x0", "00x480", "0016x0480", "99999x1", "1x1", "832x480"):
        r = client.post("/v1/videos", data={"prompt": "fox", "size": text})
        assert (r.status_code != 422) == bool(size.fullmatch(text)), (text, r.text)


# -- 6. a locked store ---------------------------------------------------------------------------------------


def test_a_locked_store_makes_requests_fail_fast_not_hang(tmp_path):
    app = _app(tmp_path, store_busy_timeout=0.3)
    held, release = threading.Event(), threading.Event()

    def hold_lock():
        db = sqlite3.connect(tmp_path / "jobs.db", isolation_level=None)
        db.execute("BEGIN EXCLUSIVE")
        held.set()
        release.wait(10)
        db.execute("ROLLBACK")
        db.close()

    holder = threading.Thread(target=hold_lock)
    holder.start()
    held.wait(5)

    async def timed(client, method, path, **kw):
        start = time.monotonic()
        r = await client.request(method, path, **kw)
        return r, time.monotonic() - start

    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            writes = [timed(client, "POST", "/generate", json={"prompt": f"fox {i}"}) for i in range(3)]
            writes.append(timed(client, "POST", "/v1/videos", json={"prompt": "fox"}))
            healths = [timed(client, "GET", "/health") for _ in range(5)]
            return await asyncio.gather(*writes, *healths, timed(client, "GET", "/jobs"))

    try:
        replies = asyncio.run(main())
    finally:
        release.set()
        holder.join()
    writes, healths, (jobs, _) = replies[:4], replies[4:9], replies[9]
    print(
        "under a held lock: /health",
        [round(s, 3) for _, s in healths],
        "writes",
        [round(s, 3) for _, s in writes],
    )
    for r, seconds in healths:
        assert r.status_code == 200 and seconds < 0.5, seconds
    for r, seconds in writes:
        assert r.status_code == 503 and r.headers["retry-after"] and seconds < 3, (r.text, seconds)
    assert writes[3][0].json()["error"]["type"] == "api_error"  # the /v1 shape
    assert jobs.status_code in (200, 503)


def test_a_video_before_any_worker_published_its_defaults_has_an_empty_size(tmp_path):
    config = ServeConfig(workers=False, data_dir=str(tmp_path))
    with TestClient(create_app(config), raise_server_exceptions=False) as bare:  # nothing published yet
        r = bare.post("/v1/videos", json={"prompt": "a boat"})
        assert r.status_code == 200, r.text
        assert r.json()["size"] == "" and r.json()["seconds"] == ""


def test_generate_takes_a_step_cache_per_request(client):
    """`cache` is checked at the door (422 naming it) and stored in its canonical form for the worker."""
    for bad in ("fbcache:9", "teacache", "fbcache:x", 0.1):
        r = client.post("/generate", json={"prompt": "a fox", "cache": bad})
        assert r.status_code == 422 and _field(r) == "cache", r.text
    r = client.post("/generate", json={"prompt": "a fox", "cache": "fbcache"})
    assert r.status_code == 202 and r.json()["request"]["cache"] == "fbcache:0.08", r.text


def test_v1_refuses_a_size_or_duration_the_model_cannot_make_and_says_what_it_rounds(client):
    """The tiny limits: width and height 16..256 in steps of 16, 5..33 frames (4k + 1) at 16 fps."""
    sizes = "width 16 to 256 in steps of 16, height 16 to 256 in steps of 16"
    durations = "0.3125 to 2.0625 seconds (5 to 33 frames at 16 fps)"
    for fields, field, allowed in [
        ({"size": "4096x4096"}, "size", sizes),
        ({"size": "832x480", "seconds": "1"}, "size", sizes),
        ({"size": "64x8"}, "size", sizes),
        ({"seconds": "4"}, "seconds", durations),
        ({"seconds": 0.25}, "seconds", durations),
    ]:
        r = client.post("/v1/videos", json={"prompt": "fox", **fields})
        assert r.status_code == 422 and _field(r) == field, r.text
        assert r.json()["error"]["message"].endswith(f"is outside the model's limits: {allowed}"), r.text
    # inside them: the nearest multiples of 16 (40 lies halfway: up), 17.6 frames → 17; the reply says so
    r = client.post("/v1/videos", json={"prompt": "fox", "size": "100x40", "seconds": "1.1"})
    assert r.status_code == 200, r.text
    assert (r.json()["size"], r.json()["seconds"]) == ("96x48", "1.0625")
    request = client.get(f"/jobs/{r.json()['id']}").json()["request"]
    assert request == {"prompt": "fox", "width": 96, "height": 48, "num_frames": 17}
    for size in ("16x256", "256x16"):  # the bounds themselves are made as asked
        assert client.post("/v1/videos", json={"prompt": "fox", "size": size}).json()["size"] == size


def test_a_prompt_outside_a_declared_vocabulary_is_warned_of_on_both_apis(client, tmp_path):
    vocabulary = read_vocabulary("tiny")  # what a worker of the trained tiny model publishes
    with TestClient(_app(tmp_path / "tiny", vocabulary), raise_server_exceptions=False) as tiny:
        job = tiny.post("/generate", json={"prompt": "a red fox in snow"}).json()
        (warning,) = job["warnings"]
        assert warning.startswith("the model does not know the words fox, in, snow: it draws coloured shapes")
        assert warning.endswith(" ".join(vocabulary["words"])) and "circle" in vocabulary["words"]
        assert tiny.get(f"/jobs/{job['id']}").json()["warnings"] == [warning]
        video = tiny.post("/v1/videos", json={"prompt": "a paper boat on a pond"}).json()
        assert video["warnings"][0].startswith("the model does not know the words paper, boat, on, pond:")
        assert tiny.get(f"/v1/videos/{video['id']}").json()["warnings"] == video["warnings"]
        fine = tiny.post("/generate", json={"prompt": "The big violet ball, sliding to the left."})
        assert fine.json()["warnings"] == []
        assert tiny.get("/limits").json()["vocabulary"] == vocabulary
    # a model that declares no vocabulary (every real one) is never warned about
    assert client.post("/generate", json={"prompt": "a red fox in snow"}).json()["warnings"] == []
    assert client.post("/v1/videos", json={"prompt": "a paper boat"}).json()["warnings"] == []
    assert client.get("/limits").json()["vocabulary"] is None
