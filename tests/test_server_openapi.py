"""The OpenAPI document tells the truth: the responses, media types and limits it declares, every operation
fuzzed against it (schemathesis), 405s naming the path's methods, HEAD and conditional GETs on files, and
/v1's patterns taking exactly what the route takes. In-process: the ASGI app with the tiny model's limits
published."""

from __future__ import annotations

import json
import math
import re
import time

import jsonschema_rs
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from starlette.applications import Starlette
from starlette.routing import Route

from dit.pipeline import TINY_LIMITS
from server.file_response import ConditionalFile
from testing.published import LORA_CATALOGUE, TINY_RANDOM_TOKENS, tiny_random_app


@pytest.fixture
def client(tmp_path):
    with TestClient(tiny_random_app(tmp_path), raise_server_exceptions=False) as c:
        yield c


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
    assert f"at most {TINY_RANDOM_TOKENS} tokens" in fields["prompt"]["description"]
    assert client.head("/health").status_code == 200
    probe = client.head("/ready")  # a load balancer's: the status alone
    assert probe.status_code == client.get("/ready").status_code == 200 and probe.content == b""


def test_every_json_reply_is_what_the_document_says(client):
    """Both APIs' replies for a job in each state it passes through (queued, running with a preview,
    completed, failed by its time limit, cancelled, deleted), the lists, /health and /ready, each against the
    document's schema for its route and status (they had none: any body passed)."""
    doc = client.get("/openapi.json").json()
    store = client.app.state.services.store

    def check(r, path: str, method: str = "get"):
        content = doc["paths"][path][method]["responses"][str(r.status_code)]["content"]
        schema = content["application/json"]["schema"]
        assert "$ref" in schema, (path, method, r.status_code)  # a model's, not {}
        validator = jsonschema_rs.Draft202012Validator(schema | {"components": doc["components"]})
        validator.validate(r.json())
        assert not validator.is_valid(r.json() | {"unlisted": 1})  # every field the reply has is described
        return r.json()

    ids = [
        check(client.post("/generate", json={"prompt": "fox"}), "/generate", "post")["id"] for _ in range(4)
    ]
    ids.append(check(client.post("/v1/videos", json={"prompt": "fox"}), "/v1/videos", "post")["id"])
    claimed = [store.claim("w", "box") for _ in range(3)]
    for job in claimed:
        store.set_spec(job.id, job.spec | {"num_inference_steps": 4})
        store.set_phase(job.id, "w", "denoising", {"encoding_s": 0.1})
        store.progress(job.id, "w", 2, 4)
    store.set_preview(claimed[0].id, "w", 2)  # still running
    timings = {"decoding_s": 0.2, "writing_s": 0.01, "total_s": 1.0, "steps": 4, "mean_step_s": 0.2}
    store.finish(
        claimed[1].id,
        "w",
        "completed",
        video=f"{claimed[1].id}.mp4",
        timings=timings | {"evaluated": 8, "skipped": 0},
    )
    store.finish(
        claimed[2].id,
        None,
        "failed",
        error="over",
        timings=store.get(claimed[2].id).timings_until(time.time()),
    )
    check(client.delete(f"/jobs/{ids[3]}"), "/jobs/{job_id}", "delete")  # queued: cancelled
    statuses = set()
    for job_id in ids:
        view = check(client.get(f"/jobs/{job_id}"), "/jobs/{job_id}")
        statuses.add(view["status"])
        links = check(client.get(f"/jobs/{job_id}/links"), "/jobs/{job_id}/links")
        plain = {"video_url": view["video_url"], "preview_url": view["preview_url"], "expires_at": None}
        assert links == plain  # no key: the paths
        check(client.get(f"/v1/videos/{job_id}"), "/v1/videos/{video_id}")
    assert statuses == {"queued", "in_progress", "completed", "failed", "cancelled"}
    check(client.get("/jobs"), "/jobs")
    check(client.get("/v1/videos"), "/v1/videos")
    check(client.delete(f"/v1/videos/{ids[0]}"), "/v1/videos/{video_id}", "delete")
    check(client.get("/health"), "/health")
    assert check(client.get("/ready"), "/ready")["ready"] is True  # a published replica's


def test_the_document_says_which_routes_need_the_key(tmp_path):
    with TestClient(tiny_random_app(tmp_path, api_key="k")) as keyed:
        doc = keyed.get("/openapi.json", headers={"Authorization": "Bearer k"}).json()
    assert doc["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    assert doc["security"] == [{"apiKey": []}] and doc["paths"]["/health"]["get"]["security"] == []
    assert "security" not in doc["paths"]["/jobs"]["get"]  # the document's own: a key
    for path in ("/jobs/{job_id}/video", "/jobs/{job_id}/preview"):  # or a signed link's query
        for method in ("get", "head"):
            names = [p["name"] for p in doc["paths"][path][method]["parameters"]]
            assert names == ["job_id", "expires", "signature"], (path, method)
    with TestClient(tiny_random_app(tmp_path / "open")) as open_:
        assert "security" not in open_.get("/openapi.json").json()


@pytest.mark.slow  # hundreds of requests
def test_schema_fuzzing(tmp_path):
    """Every operation of the app's own OpenAPI, positive and negative examples, under every schemathesis
    check: no 5xx, every reply one the document declares (status, media type, body schema), every request
    the document calls valid taken and every invalid one refused (`loras` too: a catalogue is published).
    Bounded: a fixed number of examples."""
    app = tiny_random_app(tmp_path, loras=LORA_CATALOGUE, max_queue=10_000)
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
        declared = {method.upper() for method in operations}
        head = {"HEAD"} if "GET" in declared else set()  # server.head
        assert set(r.headers["allow"].split(", ")) == declared | head, path


def test_a_trailing_slash_is_the_path_without_it(tmp_path):
    """Served as is: Starlette redirected to an absolute URL made of the Host header (behind a proxy that
    ends TLS, an http:// one), and the key check took `/health/` for a path of its own."""
    with TestClient(tiny_random_app(tmp_path, api_key="k")) as client:
        key = {"Authorization": "Bearer k", "Host": "elsewhere.example"}
        made = client.post("/generate/", json={"prompt": "fox"}, headers=key, follow_redirects=False)
        assert made.status_code == 202, made.text
        for url in ("/jobs/", f"/jobs/{made.json()['id']}//", "/v1/videos/"):
            got = client.get(url, headers=key, follow_redirects=False)
            assert got.status_code == 200 and "location" not in got.headers, (url, got.status_code)
        assert client.get("/health/").status_code == 200  # public, as /health
        assert client.get("/", follow_redirects=False).status_code == 200  # the page


def test_every_get_answers_head_with_its_headers_alone(client):
    """RFC 9110 §9.3.2: HEAD wherever GET is, the GET's status and headers, no body; an event stream ends at
    its headers (the job below is queued: its GET would stream on)."""
    job_id = client.post("/generate", json={"prompt": "fox"}).json()["id"]
    urls = ("/jobs", f"/jobs/{job_id}", "/limits", "/metrics", "/loras", "/v1/videos", f"/v1/videos/{job_id}")
    for url in (*urls, "/nope", "/jobs/nope"):  # a 404 too
        got, head = client.get(url), client.head(url)
        assert (head.status_code, head.content) == (got.status_code, b"") and got.content, url
        assert head.headers["content-length"] == str(len(got.content)), url
        assert head.headers["content-type"] == got.headers["content-type"], url
    events = client.head(f"/jobs/{job_id}/events")
    assert events.status_code == 200 and events.headers["content-type"].startswith("text/event-stream")
    assert client.head("/generate").status_code == 405
    assert client.head(f"/jobs/{'b' * 32}").status_code == 404


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


def test_a_file_held_is_not_sent_again(client, tmp_path, monkeypatch):
    """If-None-Match naming the ETag: 304, no body, the validators kept (RFC 9110 §13.1.2, §15.4.5); a
    Range in another unit or malformed is ignored (§14.2), one in bytes still honoured, a set as far as it
    starts within the file, one wholly past the end a 416 in the route's shape; a file deleted before it is
    opened: 404; after: served whole."""
    store = client.app.state.services.store
    job, _ = store.create({"prompt": "fox"})
    store.claim("w", "box")
    (tmp_path / "videos").mkdir(exist_ok=True)
    video = tmp_path / "videos" / f"{job.id}.mp4"
    video.write_bytes(bytes(range(200)))
    store.finish(job.id, "w", "completed", video=f"{job.id}.mp4")
    for url in (f"/jobs/{job.id}/video", f"/v1/videos/{job.id}/content", "/web/app.js"):
        first = client.get(url)
        etag = first.headers["etag"]
        for held in (etag, f'"other", W/{etag}', "*"):
            again = client.get(url, headers={"If-None-Match": held})
            assert again.status_code == 304 and again.content == b"", (url, held)
            assert again.headers["etag"] == etag and "content-length" not in again.headers
        assert client.get(url, headers={"If-None-Match": '"other"'}).content == first.content, url
    app_js = client.get("/web/app.js", headers={"If-None-Match": client.get("/web/app.js").headers["etag"]})
    assert app_js.headers["cache-control"] == "no-cache"  # kept on the 304: the page revalidates every time
    url = f"/jobs/{job.id}/video"
    for ignored in ("items=0-9", "bytes", "bytes=5-2"):  # Starlette answered the last two a plain-text 400
        whole = client.get(url, headers={"Range": ignored})
        assert whole.status_code == 200 and whole.content == bytes(range(200)), ignored
    part = client.get(url, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == bytes(range(10, 20))
    part = client.get(url, headers={"Range": "bytes=10-19, 999-"})  # was a 416 as a whole (§14.1.1)
    assert part.status_code == 206 and part.content == bytes(range(10, 20))
    assert part.headers["content-range"] == "bytes 10-19/200"
    past = client.get(url, headers={"Range": "bytes=999-, -0"})
    assert past.status_code == 416 and past.headers["content-range"] == "bytes */200"
    assert past.json()["detail"] == "the range 'bytes=999-, -0' starts past the file's 200 bytes"
    past = client.get(f"/v1/videos/{job.id}/content", headers={"Range": "bytes=999-"})
    assert past.status_code == 416 and "starts past" in past.json()["error"]["message"]
    answer = ConditionalFile._answer

    async def deleted_once_open(response, *args):  # a DELETE between the open and the body
        video.unlink()
        await answer(response, *args)

    monkeypatch.setattr(ConditionalFile, "_answer", deleted_once_open)
    sent = client.get(url)
    assert sent.status_code == 200 and sent.content == bytes(range(200))  # the body stopped short: 0 bytes
    monkeypatch.undo()
    gone = Starlette(routes=[Route("/", lambda request: ConditionalFile(video))])  # found, then deleted
    with TestClient(gone) as raced:
        assert raced.get("/").status_code == 404


def test_keep_hours_deletes_what_finished_before_and_says_when(tmp_path):
    """--keep-hours: a finished job's views say when it goes (`expires_at`); a sweep past that deletes it as
    DELETE /v1/videos/ID does, its MP4 and preview with it; a running job and a newer one stay."""
    from server import videos
    from server.retention import Retention

    with TestClient(tiny_random_app(tmp_path, keep_hours=2.0), raise_server_exceptions=False) as client:
        services = client.app.state.services
        store = services.store
        old, new, running = (store.create({"prompt": p})[0] for p in ("old", "new", "running"))
        (tmp_path / "videos").mkdir(exist_ok=True)
        for job in (old, new):
            store.claim("w", "box")
            (tmp_path / "videos" / f"{job.id}.mp4").write_bytes(b"mp4")
            videos.write_preview(str(tmp_path / "videos"), job.id, b"webp")
            store.finish(job.id, "w", "completed", video=f"{job.id}.mp4")
        store.claim("w", "box")
        finished = store.get(old.id).finished_at
        assert client.get(f"/jobs/{old.id}").json()["expires_at"] == math.ceil(finished + 7200)  # not before
        assert client.get(f"/v1/videos/{old.id}").json()["expires_at"] == math.ceil(finished + 7200)
        assert client.get(f"/jobs/{running.id}").json()["expires_at"] is None
        assert Retention(services, 2.0).sweep(now=(finished + store.get(new.id).finished_at) / 2 + 7200) == 1
        assert client.get(f"/jobs/{old.id}").status_code == 404
        left = sorted(path.name for path in (tmp_path / "videos").rglob("*.*"))
        assert left == [f"{new.id}.mp4", f"{new.id}.webp"]
        assert client.get(f"/jobs/{running.id}").json()["status"] == "in_progress"
    with TestClient(tiny_random_app(tmp_path / "kept"), raise_server_exceptions=False) as client:
        job, _ = client.app.state.services.store.create({"prompt": "x"})
        assert client.get(f"/jobs/{job.id}").json()["expires_at"] is None  # 0, the default: kept


def test_the_document_describes_what_the_routes_take(client):
    """A form has no null; a text-to-video model's bodies have no image; /v1's seconds and size patterns
    take exactly what the route does."""
    doc = client.get("/openapi.json").json()
    body = doc["paths"]["/generate"]["post"]["requestBody"]["content"]
    form = doc["components"]["schemas"][body["multipart/form-data"]["schema"]["$ref"].split("/")[-1]]
    assert "null" not in json.dumps(form) and "image" not in form["properties"]
    assert "image" not in doc["components"]["schemas"]["GenerateBody"]["properties"]
    for path in ("/generate", "/v1/videos"):  # no encoding of a field the body does not have
        media = doc["paths"][path]["post"]["requestBody"]["content"]["multipart/form-data"]
        fields = form if path == "/generate" else media["schema"]
        assert set(media["encoding"]) <= set(fields["properties"]), (path, media["encoding"])
    for media in doc["paths"]["/v1/videos"]["post"]["requestBody"]["content"].values():
        assert set(media["schema"]["properties"]) == {"prompt", "model", "seconds", "size", "seed"}
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


def test_a_file_another_server_wrote_is_a_404_naming_it(client):
    """Servers sharing a store but not a results folder: the video's and the preview's 404 name the server
    that wrote them (the preview's said "no preview yet" of a completed job)."""
    store = client.app.state.services.store
    job, _ = store.create({"prompt": "fox"})
    store.claim("other/g/replica0", "other-box")
    store.set_preview(job.id, "other/g/replica0", 2)
    store.finish(job.id, "other/g/replica0", "completed", video=f"{job.id}.mp4")
    for url in (f"/jobs/{job.id}/video", f"/jobs/{job.id}/preview"):
        r = client.get(url)
        assert r.status_code == 404 and "server 'other-box' wrote it" in r.json()["detail"], (url, r.text)
    assert "the preview of job" in client.get(f"/jobs/{job.id}/preview").json()["detail"]


def test_metrics_answer_through_a_store_outage(client, monkeypatch):
    """A scrape that failed would read as the server down: /metrics answers, the store's series left out and
    `ithaca_store_up 0` saying why (it was a 503)."""
    from server.store import StoreBusy

    assert "ithaca_store_up 1" in client.get("/metrics").text

    def busy(*args, **kwargs):
        raise StoreBusy("the job store is unreachable")

    monkeypatch.setattr(client.app.state.services.store, "counts", busy)
    r = client.get("/metrics")
    assert r.status_code == 200 and "ithaca_store_up 0" in r.text and "ithaca_ready 0" in r.text
    assert "ithaca_queue_depth" not in r.text and "ithaca_worker_restarts_total 0" in r.text


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_pages_need_no_internet(client, page):
    """A GPU box is often offline: every script, style and icon the page names is served here, and the page
    reads this server's document."""
    html = client.get(page).text
    urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html)
    assert urls and not [u for u in urls if "//" in u], urls
    assert "/openapi.json" in urls
    scripts = [u for u in urls if u.endswith(".js")]
    assert scripts
    for url in urls:
        reply = client.get(url)
        assert reply.status_code == 200 and len(reply.content) > 1000, url
    for url in scripts:
        assert "javascript" in client.get(url).headers["content-type"]
