"""What a client can send, as a new user or an attacker would: text that UTF-8 cannot encode, non-finite and
oversized numbers, deep JSON, loose formats, wrong media types, a reused Idempotency-Key, and a job store
another process keeps locked. In-process (the ASGI app, no worker group): the tiny model's limits are
published into the store as a worker would."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from dit.vocabulary import read_vocabulary
from server import videos
from server.app import create_app
from server.config import ServeConfig
from server.store import JobStore
from testing.published import TINY_RANDOM_TOKENS as MAX_TOKENS
from testing.published import tiny_random_app

NUMBERS = ("num_frames", "height", "width", "num_inference_steps", "guidance_scale", "seed", "fps")


@pytest.fixture
def client(tmp_path):
    with TestClient(tiny_random_app(tmp_path), raise_server_exceptions=False) as c:
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
    assert r.status_code in (200, 422)  # urlencoded is read as UTF-8: no surrogate can appear
    form = b'--B\r\nContent-Disposition: form-data; name="prompt"\r\n\r\n+2AA-\r\n--B--\r\n'
    r = _raw(client, "/v1/videos", form, "multipart/form-data; charset=utf-7; boundary=B")
    assert r.status_code in (200, 422) and client.get("/v1/videos").status_code == 200


def test_a_multipart_text_part_is_read_in_its_charset_or_refused(client):
    """Bytes that are not UTF-8 were read as Latin-1: the prompt became other text in silence."""
    for path in ("/generate", "/v1/videos"):
        made = client.post(path, files={"prompt": (None, "café fox".encode())}).json()
        assert (made["prompt"] if path == "/v1/videos" else made["request"]["prompt"]) == "café fox", made
        bad = client.post(path, files={"prompt": (None, b"a \xff\xfe fox")})
        assert bad.status_code == 400 and "the form's part 'prompt' is not utf-8" in bad.text, bad.text


def test_urlencoded_form_is_read_as_utf8(client):
    """`curl -d 'prompt=…'` sends UTF-8 raw, not percent-encoded: the prompt must be the one typed."""
    form = "application/x-www-form-urlencoded"
    for body in ("prompt=a+café+fox&seed=3".encode(), b"prompt=a+caf%C3%A9+fox&seed=3"):
        r = _raw(client, "/v1/videos", body, form)
        assert r.status_code == 200, r.text
        assert client.get(f"/jobs/{r.json()['id']}").json()["request"]["prompt"] == "a café fox"
    for body in (b"prompt=caf\xe9", b"prompt=caf%E9"):  # Latin-1, raw or percent-encoded
        r = _raw(client, "/v1/videos", body, form)
        assert r.status_code == 400 and "not UTF-8" in r.text, r.text


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


def test_a_forms_numbers_are_read_as_json_writes_them(client):
    """A form's "17", "2.5", "1e1" and "9.0" are numbers, as in JSON; text Python's own parse would also take
    ("1_0" as 10, " 7" and "+7" as 7, Arabic-Indic digits, 5000 digits) is refused naming the field."""
    form = {"prompt": "fox", "num_frames": "17", "guidance_scale": "2.5", "seed": "9.0", "fps": "1e1"}
    r = client.post("/generate", files={k: (None, v) for k, v in form.items()})  # multipart, as the page's
    assert r.status_code == 202, r.text
    request = r.json()["request"]
    assert (request["num_frames"], request["guidance_scale"], request["seed"], request["fps"]) == (
        17,
        2.5,
        9,
        10,
    )
    for field, text in [("seed", "1_0"), ("guidance_scale", "1_0"), ("num_inference_steps", " 7"),
                        ("fps", "+7"), ("height", "٣٢"), ("seed", "9" * 5000)]:  # fmt: skip
        r = client.post("/generate", files={"prompt": (None, "fox"), field: (None, text)})
        assert r.status_code == 422 and _field(r) == field, (field, text, r.text)


@pytest.mark.parametrize(
    "value", [b"NaN", b"Infinity", b"-1e999", b"1" + b"0" * 400, b"true", b'"nan"', b'"inf"', b'"0"']
)
def test_bad_seconds_on_v1(client, value):
    r = _raw(client, "/v1/videos", b'{"prompt": "fox", "seconds": %s}' % value)
    assert r.status_code == 422 and _field(r) == "seconds", r.text
    if value == b'"0"':  # quoted as sent
        assert r.json()["error"]["message"].startswith("seconds='0' must be"), r.text


@pytest.mark.parametrize("method,path", [("POST", "/v1/videos/abc/remix"), ("GET", "/nowhere")])
def test_a_route_the_server_lacks_is_a_404_that_says_so(client, method, path):
    r = client.request(method, path, json={"prompt": "fox"})
    message = r.json()["error"]["message"] if path.startswith("/v1") else r.json()["detail"]
    assert (
        r.status_code == 404
        and message == f"this server has no {method} '{path}'; /openapi.json lists its routes"
    )


@pytest.mark.parametrize("path", ["/generate", "/v1/videos"])
def test_deeply_nested_or_undecodable_json(client, path):
    for body in (b'{"prompt": "fox", "seconds": ' + b"[" * 1000 + b"]" * 1000 + b"}", b"\x80", b"\0" * 9):
        r = _raw(client, path, body)
        assert r.status_code in (400, 422) and r.headers["content-type"] == "application/json", r.text
    for body in (b'{"prompt": "fox"', b"not json", b""):  # a 400 on both routes, as the README says
        r = _raw(client, path, body)
        assert r.status_code == 400 and "the body is not valid JSON" in r.text, r.text
    r = _raw(
        client, path, b'{"prompt": "fox", "seed": %s}' % (b"9" * 5000)
    )  # past Python's int() limit: a 500
    assert r.status_code == 400 and "a number of more than 4300 digits" in r.text, r.text


def test_a_header_given_twice_that_the_guard_and_the_route_read_is_refused(client):
    """Two Content-Types took a large JSON body past the guard's JSON bound (it read the last, a form; the
    route the first); two keys, another key than the one checked."""
    body = b'{"prompt": "fox"' + b" " * 100_000 + b"}"
    for name, values in (
        ("content-type", ["application/json", "multipart/form-data"]),
        ("idempotency-key", ["a", "b"]),
        ("authorization", ["Bearer x", "Bearer y"]),
    ):
        headers = [("content-type", "application/json")] * (name != "content-type")
        r = client.post("/generate", content=body, headers=headers + [(name, v) for v in values])
        assert r.status_code == 400 and r.json()["detail"] == f"{name.title()} is given 2 times; give it once"


def test_a_client_gone_mid_body_is_no_error_in_the_log(client, caplog):
    """The body ends in a disconnect: a quiet 400 (no one reads it), not an ASGI traceback."""
    messages = [
        {"type": "http.request", "body": b'{"prompt"', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    headers = [(b"content-type", b"application/json"), (b"content-length", b"40")]
    scope = {"type": "http", "method": "POST", "path": "/generate", "raw_path": b"/generate",
             "headers": headers, "query_string": b"", "http_version": "1.1", "scheme": "http",
             "server": ("test", 80), "client": ("test", 1), "root_path": ""}  # fmt: skip
    with caplog.at_level(logging.ERROR):
        asyncio.run(client.app(scope, receive, send))
    assert sent[0]["status"] == 400 and not caplog.records, caplog.text


def test_a_value_past_a_sanity_bound_hears_the_models_range(client):
    """Below 1 (or a guidance below 0) fails the body's own bounds before the model's limits are looked at:
    the message is the limits' all the same."""
    for field, value in (("height", 0), ("num_frames", 0), ("guidance_scale", -1), ("fps", 0)):
        r = client.post("/generate", json={"prompt": "fox", field: value})
        assert r.status_code == 422 and _field(r) == field, r.text
        assert f"{field}={value} is out of range: allowed" in r.json()["detail"][0]["msg"], r.text
    form = b'--B\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nfox\r\n'
    form += b'--B\r\nContent-Disposition: form-data; name="width"\r\n\r\n-16\r\n--B--\r\n'
    r = _raw(client, "/generate", form, "multipart/form-data; boundary=B")
    assert r.status_code == 422 and "width=-16 is out of range: allowed" in r.text, r.text
    r = client.post("/v1/videos", json={"prompt": "fox", "size": "0x0"})
    assert r.status_code == 422 and "outside the model's limits: width" in r.text, r.text


def test_the_event_stream_says_when_its_job_is_deleted(client, monkeypatch):
    """DELETE /v1/videos/ID while a client follows the job: the stream ends with a `deleted` event, not in
    silence a client cannot tell from a dropped connection."""
    job_id = client.post("/generate", json={"prompt": "fox"}).json()["id"]
    services = client.app.state.services
    real_get, calls = services.store.get, []

    def get(jid):
        calls.append(jid)
        if len(calls) == 2:  # the stream's first look, after its 404 check: deleted just before it
            services.cancel(jid, delete=True)
        return real_get(jid)

    monkeypatch.setattr(services.store, "get", get)
    with client.stream("GET", f"/jobs/{job_id}/events") as r:
        last = r.read().decode().strip().split("\n\n")[-1].split("\n")
    assert r.status_code == 200 and last[0] == "event: deleted", last
    assert json.loads(last[1].removeprefix("data: ")) == {"id": job_id, "deleted": True}
    assert client.get(f"/jobs/{job_id}").status_code == 404


def test_the_event_stream_says_each_phase_and_keeps_a_quiet_stream_alive(client, monkeypatch):
    """A job waits in the queue (the same view for a while: a comment line keeps a proxy from dropping the
    stream), then decodes and writes at its last step (a phase change alone is an event)."""
    from server import api_jobs

    job_id = client.post("/generate", json={"prompt": "fox"}).json()["id"]
    view = client.get(f"/jobs/{job_id}").json()
    running = view | {"status": "in_progress", "step": 2, "queue_position": None}
    views = iter(
        [view] * 6  # 0.6 s queued
        + [running, running | {"cancel_requested": True}]  # asked elsewhere: an event (it was none)
        + [running | {"phase": "decoding"}, running | {"phase": "writing"}, running | {"status": "completed"}]
    )
    monkeypatch.setattr(api_jobs, "SSE_KEEPALIVE_S", 0.25)
    monkeypatch.setattr(api_jobs, "_current_view", lambda services, jid: next(views))
    with client.stream("GET", f"/jobs/{job_id}/events") as r:
        events = [e.split("\n")[0] for e in r.read().decode().strip().split("\n\n")]
    assert events[0] == "event: progress" and events[-5:] == ["event: progress"] * 4 + ["event: done"]
    assert events[1:-5] and set(events[1:-5]) == {": keep-alive"}, events  # 0.5 s of sleeps, or more


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
    for text in ("  \n\t ", "\u200b", "\ufeff \u200d\u00ad", "\u3164\u034f", "\u2800"):  # nothing to read
        blank = client.post(path, json={"prompt": text})
        assert blank.status_code == 422 and _field(blank) == "prompt", (text, blank.text)
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

    assert "idempotent-replayed" not in first.headers and again.headers["idempotent-replayed"] == "true"
    v1 = client.post("/v1/videos", json={"prompt": "fox"}, headers=key)  # another route family: another job
    assert v1.status_code == 200 and v1.json()["id"] != first.json()["id"]
    v1_again = client.post("/v1/videos", json={"prompt": "fox"}, headers=key)
    assert v1_again.json()["id"] == v1.json()["id"] and v1_again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in v1.headers
    named = client.post("/v1/videos", json={"prompt": "fox", "model": "sora-2"})
    assert named.json()["model"] == v1.json()["model"] == "tiny-random"  # what makes the video
    conflict = client.post("/v1/videos", json={"prompt": "cat"}, headers=key)
    assert conflict.status_code == 409 and conflict.json()["error"]["type"] == "invalid_request_error"
    assert client.delete(f"/v1/videos/{v1.json()['id']}").status_code == 200
    reused = client.post("/v1/videos", json={"prompt": "cat"}, headers=key)  # free again once deleted
    assert reused.status_code == 200 and reused.json()["id"] != v1.json()["id"]
    empty = client.post(
        "/generate", json={"prompt": "fox"}, headers={"Idempotency-Key": ""}
    )  # every client's
    assert (
        empty.status_code == 400 and empty.json()["detail"] == "Idempotency-Key must be 1 to 255 characters"
    )


def test_v1_replays_a_request_however_its_values_are_spelled(client):
    """The same /v1 request under one key: seed 7 as "7" (what a form sends) or 7.0, a null for a field left
    out, seconds "1" as 1.0; each was a 409. Another seed is still one."""
    key, body = {"Idempotency-Key": "spelled"}, {"prompt": "fox", "seed": 7, "seconds": "1"}
    first = client.post("/v1/videos", json=body, headers=key)
    assert first.status_code == 200, first.text
    for same in ({"seed": "7"}, {"seed": 7.0}, {"model": None}, {"seconds": 1.0}):
        r = client.post("/v1/videos", json=body | same, headers=key)
        assert r.status_code == 200 and r.json()["id"] == first.json()["id"], (same, r.text)
    form = client.post("/v1/videos", data={"prompt": "fox", "seed": "7", "seconds": "1"}, headers=key)
    assert form.status_code == 200 and form.json()["id"] == first.json()["id"], form.text
    assert client.post("/v1/videos", json=body | {"seed": 8}, headers=key).status_code == 409


def test_a_null_negative_prompt_is_one_left_out(client):
    """Every other field sent as null was taken as left out; this one was a 422 ("a valid string")."""
    key = {"Idempotency-Key": "negative"}
    first = client.post("/generate", json={"prompt": "fox"}, headers=key)
    again = client.post("/generate", json={"prompt": "fox", "negative_prompt": None}, headers=key)
    assert (first.status_code, again.status_code) == (202, 202), again.text
    assert again.json()["id"] == first.json()["id"]


def test_a_retried_request_gets_its_job_from_a_full_queue(tmp_path):
    """The queue's one place is the key's own job: a retry replays it (a 429 told the client to retry what
    was already queued), another body is still the key's 409, and a new request the queue's 429."""
    with TestClient(tiny_random_app(tmp_path, max_queue=1)) as client:
        key = {"Idempotency-Key": "full"}
        first = client.post("/generate", json={"prompt": "fox"}, headers=key)
        again = client.post("/generate", json={"prompt": "fox"}, headers=key)
        assert (first.status_code, again.status_code) == (202, 202)
        assert again.json()["id"] == first.json()["id"] and again.headers["idempotent-replayed"] == "true"
        assert client.post("/generate", json={"prompt": "cat"}, headers=key).status_code == 409
        full = client.post("/generate", json={"prompt": "cat"})
        assert full.status_code == 429 and "the queue is full (1 job waiting)" in full.text, full.text
        assert full.headers["retry-after"] == "1"  # nothing known of a job's time
        # before any job ended, the running one's pace says when: 45 % in 9 s, a job of 20 s (it said 1 s)
        store = client.app.state.services.store
        running = store.claim("w", "box")
        store.progress(running.id, "w", 5, 10)
        with sqlite3.connect(tmp_path / "jobs.db") as db:
            db.execute("UPDATE jobs SET started_at = ? WHERE id = ?", (time.time() - 9, running.id))
        assert client.post("/generate", json={"prompt": "cat"}).status_code == 202
        assert client.post("/generate", json={"prompt": "dog"}).headers["retry-after"] == "20"


def test_a_cancel_sent_again_answers_the_cancelled_job(client):
    """A client that retries a cancel whose answer it lost hears the job's view, not a 409."""
    job = client.post("/generate", json={"prompt": "fox"}).json()
    first, again = (client.delete(f"/jobs/{job['id']}") for _ in range(2))
    assert (first.status_code, again.status_code) == (200, 200)
    assert first.json()["status"] == again.json()["status"] == "cancelled"


def test_a_job_cancelled_while_queued_to_run_again_leaves_no_file_and_says_so(client, tmp_path):
    """Its checkpoint stayed until the next start-up (a real model's: tens of MB), and its preview, which no
    route reached any more; it said "cancelled before it started" of a job that had run."""
    store = client.app.state.services.store
    job = client.post("/generate", json={"prompt": "fox"}).json()
    store.set_preview(store.claim("w", "box").id, "w", 2)
    folder = tmp_path / "videos"
    files = [Path(videos.checkpoint_path(str(folder), job["id"])), folder / "previews" / f"{job['id']}.webp"]
    for path in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
    store.requeue_or_fail(store.get(job["id"]), max_attempts=2, reason="the worker group exited")
    cancelled = client.delete(f"/jobs/{job['id']}").json()
    assert (cancelled["status"], cancelled["error"]) == ("cancelled", "cancelled while queued to run again")
    assert not any(path.exists() for path in files)


def test_a_video_gone_from_the_disk_is_a_404_that_names_no_server_path(client, tmp_path):
    """It named the results folder's path to any client."""
    store, instance = client.app.state.services.store, client.app.state.services.config.instance
    job = client.post("/generate", json={"prompt": "fox"}).json()
    store.finish(store.claim("w", instance).id, "w", "completed", video="x.mp4")
    r = client.get(f"/jobs/{job['id']}/video")
    assert r.status_code == 404 and str(tmp_path) not in r.text, r.text
    assert r.json()["detail"] == f"the video of job {job['id']} is gone from this server's results folder"


def test_a_job_without_a_seed_gets_a_random_one_kept_in_its_request(client):
    seeds = [client.post("/generate", json={"prompt": "fox"}).json()["request"]["seed"] for _ in range(3)]
    v1 = client.post("/v1/videos", json={"prompt": "fox"}).json()["id"]
    seeds.append(client.get(f"/jobs/{v1}").json()["request"]["seed"])
    assert len(set(seeds)) == 4 and all(0 <= s < 2**32 for s in seeds)  # within the page's exact integers
    assert client.post("/generate", json={"prompt": "fox", "seed": 7}).json()["request"]["seed"] == 7
    key = {"Idempotency-Key": "seedless"}
    first, again = (client.post("/generate", json={"prompt": "fox"}, headers=key).json() for _ in range(2))
    assert first["id"] == again["id"] and first["request"]["seed"] == again["request"]["seed"]


@pytest.mark.parametrize("path", ["/jobs", "/v1/videos"])
def test_a_list_after_no_job_is_a_404_saying_so(client, path):
    r = client.get(path, params={"after": "nope"})
    assert r.status_code == 404 and "after='nope' names no job" in r.text, r.text
    client.post("/generate", json={"prompt": "fox"})
    empty = client.get(f"{path}?after=")  # a client's first page, its cursor not yet set: the start
    assert empty.status_code == 200 and empty.json()["data"] == client.get(path).json()["data"], empty.text


def test_v1_takes_a_seed_and_says_it(client):
    """Not in OpenAI's API: the SDK sends it with extra_body={"seed": 7}; a reply names the job's seed."""
    assert client.post("/v1/videos", json={"prompt": "fox", "seed": 7}).json()["seed"] == 7
    assert client.post("/v1/videos", json={"prompt": "fox", "seed": 7.0}).json()["seed"] == 7  # JSON's 7
    assert client.post("/v1/videos", data={"prompt": "fox", "seed": "07"}).json()["seed"] == 7
    drawn = client.post("/v1/videos", json={"prompt": "fox"}).json()
    assert (
        0 <= drawn["seed"] < 2**32 and client.get(f"/v1/videos/{drawn['id']}").json()["seed"] == drawn["seed"]
    )
    for bad in (2**63, -1, "abc", True, 1.5):
        r = client.post("/v1/videos", json={"prompt": "fox", "seed": bad})
        assert r.status_code == 422 and _field(r) == "seed", r.text
    r = client.post("/v1/videos", json={"prompt": "fox", "seconds": True})  # quoted as the client wrote it
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("seconds=true must be a number")


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


# -- 5. a locked store ---------------------------------------------------------------------------------------


def test_a_locked_store_makes_requests_fail_fast_not_hang(tmp_path):
    app = tiny_random_app(tmp_path, store_busy_timeout=0.3)
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
        if isinstance(bad, str):  # in words, not the document's pattern
            assert "cache must be off, fbcache, or fbcache:THRESHOLD" in r.text and "^(" not in r.text
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
        ({"seconds": 2.06250000000001}, "seconds", durations),
    ]:
        r = client.post("/v1/videos", json={"prompt": "fox", **fields})
        assert r.status_code == 422 and _field(r) == field, r.text
        assert r.json()["error"]["message"].endswith(f"is outside the model's limits: {allowed}"), r.text
    # the value as sent: it read "seconds=2.0625 is outside ...: 0.3125 to 2.0625 seconds"
    assert r.json()["error"]["message"].startswith("seconds=2.06250000000001 is outside"), r.text
    r = client.post("/v1/videos", json={"prompt": "fox", "seconds": "2.0625001"})  # a number, past the rule
    assert "must be a number in (0, 3600] (as a string: at most 6 decimals)" in r.text, r.text
    # inside them: the nearest multiples of 16 (40 lies halfway: up), 17.6 frames → 17; the reply says so
    r = client.post("/v1/videos", json={"prompt": "fox", "size": "100x40", "seconds": "1.1"})
    assert r.status_code == 200, r.text
    assert (r.json()["size"], r.json()["seconds"]) == ("96x48", "1.0625")
    request = client.get(f"/jobs/{r.json()['id']}").json()["request"]
    assert request == {"prompt": "fox", "width": 96, "height": 48, "num_frames": 17, "seed": request["seed"]}
    for size in ("16x256", "256x16"):  # the bounds themselves are made as asked
        assert client.post("/v1/videos", json={"prompt": "fox", "size": size}).json()["size"] == size


def test_a_prompt_outside_a_declared_vocabulary_is_warned_of_on_both_apis(client, tmp_path):
    vocabulary = read_vocabulary("tiny")  # what a worker of the trained tiny model publishes
    with TestClient(tiny_random_app(tmp_path / "tiny", vocabulary), raise_server_exceptions=False) as tiny:
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
    # a negative prompt that guidance 1 leaves out is (it was dropped in silence)
    unused = {"prompt": "fox", "negative_prompt": "blurry", "guidance_scale": 1}
    assert client.post("/generate", json=unused).json()["warnings"] == [
        "the negative prompt is unused: guidance 1 runs no pass with it (above 1 does)"
    ]
    assert client.post("/generate", json=unused | {"guidance_scale": 2}).json()["warnings"] == []
    assert client.post("/v1/videos", json={"prompt": "a paper boat"}).json()["warnings"] == []
    assert client.get("/limits").json()["vocabulary"] is None


def test_v1_seconds_and_size_wait_for_the_models_limits(tmp_path):
    """An API-only box before any worker group published the model's limits cannot turn seconds and a size
    into frames and pixels: a 503 to retry (it took them at 16 fps and unchecked, and the job failed later
    naming num_frames, a field the client never sent). Without them the job runs at the model's defaults."""
    from testing.published import published_app

    with TestClient(published_app(tmp_path), raise_server_exceptions=False) as client:
        r = client.post("/v1/videos", data={"prompt": "a fox", "seconds": "4", "size": "832x480"})
        assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
        error = r.json()["error"]
        assert error["message"].startswith("seconds and size: the model's frame rate and limits are not")
        assert client.post("/v1/videos", json={"prompt": "a fox"}).status_code == 200
