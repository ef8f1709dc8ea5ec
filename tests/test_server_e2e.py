"""The server end to end: real uvicorn on a loopback port, a real worker group of 2 CPU ranks (gloo) running
the real `tiny` pipeline, API key on: the session's `tiny_server` (tests/conftest.py), shared with the web
page's tests.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import imageio.v3 as iio
import openai
import pytest

from server import signed_links
from testing.server_process import ServerProcess, wait_until

pytestmark = [
    pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning"),  # the SDK's notice
    pytest.mark.slow,  # a real server (the session's tiny one): left out of the quick loop
]
LONG = {"num_frames": 33, "height": 256, "width": 256, "num_inference_steps": 50}  # seconds of work on CPU


@pytest.fixture
def server(tiny_server):
    return tiny_server


def test_submit_poll_sse_download(server, tmp_path):
    job = server.submit(
        prompt="a red fox in snow", num_frames=9, height=48, width=80, num_inference_steps=4, seed=7
    )
    assert job["status"] == "queued" and job["queue_position"] is not None
    assert server.client.get(f"/jobs/{job['id']}/video").status_code in (404, 200)
    events = server.events(job["id"])
    assert events[-1][0] == "done" and events[-1][1]["status"] == "completed"
    steps = [e["step"] for _, e in events]
    assert steps == sorted(steps) and steps[-1] == 4
    done = server.client.get(f"/jobs/{job['id']}").json()
    assert done["progress"] == 100 and done["total_steps"] == 4 and done["timings"]["steps"] == 4
    # guided by default: the prompt's and the negative prompt's pass at each step, none skipped
    assert (done["timings"]["evaluated"], done["timings"]["skipped"]) == (8, 0)
    r = server.client.get(done["video_url"])
    assert r.status_code == 200 and r.headers["content-type"] == "video/mp4"
    (tmp_path / "v.mp4").write_bytes(r.content)
    frames = iio.imread(tmp_path / "v.mp4")
    assert frames.shape[0] == 9 and frames.shape[1:3] == (48, 80)
    listing = server.client.get("/jobs", params={"limit": 1}).json()
    assert listing["data"][0]["id"] == job["id"]
    metrics = server.client.get("/metrics").text
    assert "ithaca_step_latency_seconds_count" in metrics and 'ithaca_jobs{state="completed"}' in metrics
    # one line a change, its phase where it says more than its state
    changes = re.findall(rf"job {job['id']} (\w+)(?: \((\w+)\))? ", server.log())
    running = [("in_progress", phase) for phase in ("encoding", "denoising", "decoding", "writing")]
    assert changes == [("queued", ""), *running, ("completed", "writing")]


def _evaluations(srv: ServerProcess) -> dict[str, int]:
    prefix = 'ithaca_transformer_evaluations_total{result="'
    lines = [line for line in srv.client.get("/metrics").text.splitlines() if line.startswith(prefix)]
    return {line[len(prefix) :].split('"')[0]: int(line.split()[-1]) for line in lines}


def test_the_warmup_ran_before_the_group_reported_ready(server):
    """The session's server starts with --warmup 48x80x9: its first ready answer already holds the warm-up's
    time, and each rank logged it (a 2-step guided tiny generation: well under a minute, above nothing)."""
    (warmup,) = server.first_ready["warmup"]
    assert warmup["size"] == "48x80x9" and 0 < warmup["seconds"] < 60
    # while it ran /ready said so (it said "loading, or starting again after it exited")
    warming = "the worker group is warming up (--warmup: a first generation of each size)"
    assert warming in server.unready_reasons, server.unready_reasons
    assert server.log().count("warm-up 48x80x9: ") == 2  # both ranks ran it: it is a collective generation


def test_a_cached_job_reports_its_skipped_evaluations(server):
    """The step cache on the server's 2-rank sequence-parallel group: the job view and /metrics count the
    passes it ran and skipped."""
    before = _evaluations(server)
    job = server.submit(prompt="a blue square moving left", num_inference_steps=12, cache="fbcache:0.3")
    done = server.wait_job(job["id"])
    assert done["status"] == "completed" and done["request"]["cache"] == "fbcache:0.3", done
    evaluated, skipped = done["timings"]["evaluated"], done["timings"]["skipped"]
    assert evaluated + skipped == 24 and skipped >= 2 and skipped % 2 == 0, done["timings"]
    after = {"evaluated": before["evaluated"] + evaluated, "skipped": before["skipped"] + skipped}
    wait_until(lambda: _evaluations(server) == after, 10, "the job's evaluations in /metrics")


def test_idempotency_key_returns_the_same_job(server):
    body = {"prompt": "same", "num_inference_steps": 1}
    a = server.client.post("/generate", json=body, headers={"Idempotency-Key": "abc-1"})
    b = server.client.post("/generate", json=body, headers={"Idempotency-Key": "abc-1"})
    assert a.status_code == b.status_code == 202 and a.json()["id"] == b.json()["id"]
    assert b.headers.get("Idempotent-Replayed") == "true"
    server.wait_job(a.json()["id"])


def test_cancel_running_and_queued_and_queue_full(server):
    running = server.submit(prompt="long", **LONG)
    while (state := server.client.get(f"/jobs/{running['id']}").json())["step"] < 1:
        assert state["status"] in ("queued", "in_progress")
        time.sleep(0.02)
    queued = [server.submit(prompt=f"q{i}", num_inference_steps=1) for i in range(4)]
    full = server.client.post("/generate", json={"prompt": "one too many"})
    assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1

    cancelled = server.client.delete(f"/jobs/{queued[0]['id']}").json()
    assert cancelled["status"] == "cancelled"
    seen = server.client.delete(f"/jobs/{running['id']}").json()
    assert seen["cancel_requested"]
    final = server.wait_job(running["id"])
    assert final["status"] == "cancelled" and final["step"] <= seen["step"] + 1 < LONG["num_inference_steps"]

    for job in queued[1:]:  # the workers take the next jobs
        assert server.wait_job(job["id"])["status"] == "completed"
    never_ran = server.client.get(f"/jobs/{queued[0]['id']}").json()
    assert never_ran["status"] == "cancelled" and never_ran["started_at"] is None
    assert server.client.delete(f"/jobs/{queued[1]['id']}").status_code == 409  # already completed


def test_api_key(server):
    bare = httpx.Client(base_url=server.url)
    assert bare.get("/health").status_code == 200
    for method, path in [
        ("GET", "/jobs"),
        ("GET", "/ready"),
        ("GET", "/metrics"),
        ("POST", "/generate"),
        ("GET", "/v1/videos"),
    ]:
        assert bare.request(method, path).status_code == 401
    key = server.api_key
    for wrong in ("Bearer wrong", f"Basic {key}", f"Bearer{key}", f"Bearer {key}x", key):
        assert bare.get("/jobs", headers={"Authorization": wrong}).status_code == 401, wrong
    for right in (f"Bearer {key}", f"bearer {key}", f"BEARER  {key}"):  # the scheme in any case (RFC 9110)
        assert bare.get("/jobs", headers={"Authorization": right}).status_code == 200, right


def test_signed_links_open_a_jobs_files_alone_until_they_expire(server):
    job = server.wait_job(server.submit(prompt="linked", num_inference_steps=1)["id"])
    bare = httpx.Client(base_url=server.url)
    assert bare.get(f"/jobs/{job['id']}/links").status_code == 401
    links = server.client.get(f"/jobs/{job['id']}/links").json()
    # an hour on, rounded up to 10 minutes: asked again meanwhile, the same URL, which a browser caches
    assert 0 <= links["expires_at"] - time.time() - signed_links.LINK_SECONDS <= signed_links.ROUND_S
    assert links["expires_at"] % signed_links.ROUND_S == 0
    assert server.client.get(f"/jobs/{job['id']}/links").json() == links
    video = bare.get(links["video_url"])
    assert video.status_code == 200 and video.content == server.client.get(job["video_url"]).content
    assert video.headers["cache-control"] == "private"  # no shared cache keeps it past the link's end
    part = bare.get(links["video_url"], headers={"Range": "bytes=0-99"})  # how a <video> reads it
    assert part.status_code == 206 and part.content == video.content[:100]
    assert bare.head(links["video_url"]).status_code == 200
    assert bare.get(links["preview_url"]).headers["content-type"] == "image/webp"
    path, _, query = links["video_url"].partition("?")
    expired = signed_links.signed(server.api_key, path, int(time.time()) - 1)
    forged = query.replace("signature=", "signature=0")
    for method, url in [
        ("GET", expired),
        ("GET", f"{path}?{forged}"),
        ("GET", f"{path}?{query}&expires=9999999999"),  # given twice
        ("GET", f"{path}?{query.partition('&')[0]}&signature=%FF"),  # not a signature's characters (a 500)
        ("GET", f"/jobs/{job['id']}?{query}"),  # another path
        ("GET", f"/jobs/{job['id']}/preview?{query}"),
        ("DELETE", f"/jobs/{job['id']}?{query}"),
        ("POST", f"{path}?{query}"),
    ]:
        assert bare.request(method, url).status_code == 401, (method, url)


def _malformed(job_id: str):
    big = "x" * 70_000
    yield "POST", "/generate", {"json": {}}
    yield "POST", "/generate", {"json": {"prompt": ""}}
    yield "POST", "/generate", {"json": {"prompt": 123}}
    yield "POST", "/generate", {"json": {"prompt": None}}
    for field, value in [
        ("num_frames", "ten"),
        ("num_frames", -1),
        ("num_frames", 10**12),
        ("num_frames", 10),
        ("num_frames", 9.5),
        ("num_frames", True),
        ("height", 17),
        ("width", 100_000),
        ("height", 0),
        ("num_inference_steps", 0),
        ("num_inference_steps", 10**6),
        ("guidance_scale", "high"),
        ("guidance_scale", -1),
        ("seed", -5),
        ("seed", 2**70),
        ("fps", 0),
        ("negative_prompt", ["a"]),
        ("unknown_field", 1),
    ]:
        yield "POST", "/generate", {"json": {"prompt": "x", field: value}}
    yield "POST", "/generate", {"content": b'{"prompt": "x", "guidance_scale": 1e400}'}
    yield "POST", "/generate", {"content": b'{"prompt": "x", "guidance_scale": NaN}'}
    yield "POST", "/generate", {"content": b"not json", "headers": {"Content-Type": "application/json"}}
    yield "POST", "/generate", {"json": [1, 2]}
    yield "POST", "/generate", {"json": None}
    yield "POST", "/generate", {"json": {"prompt": big}}  # over --max-body-bytes → 413
    yield "POST", "/generate", {"content": iter([b'{"prompt": "', big.encode(), b'"}'])}  # chunked, no length
    yield "POST", "/generate", {"json": {"prompt": "x"}, "headers": {"Idempotency-Key": "k" * 300}}
    yield "PUT", "/generate", {}
    yield "GET", "/jobs/not-an-id", {}
    yield "GET", "/jobs/..%2F..%2Fetc%2Fpasswd", {}
    yield "GET", "/jobs/%2e%2e/video", {}
    yield "GET", "/jobs/" + "0" * 32 + "/video", {}
    yield "GET", f"/jobs/{job_id}/..%2F..%2Fjobs.db", {}
    yield "DELETE", "/jobs/" + "f" * 32, {}
    for query in (
        {"limit": 0},
        {"limit": "abc"},
        {"limit": 10**9},
        {"order": "sideways"},
        {"status": "weird"},
    ):
        yield "GET", "/jobs", {"params": query}
    yield "POST", "/v1/videos", {"json": {"prompt": "x", "size": "big"}}
    yield "POST", "/v1/videos", {"json": {"prompt": "x", "size": "0x480"}}
    yield "POST", "/v1/videos", {"json": {"prompt": "x", "seconds": "-4"}}
    yield "POST", "/v1/videos", {"json": {"prompt": "x", "quality": "hd"}}
    yield "POST", "/v1/videos", {"json": {"size": "64x64"}}
    yield "POST", "/v1/videos", {"data": {"prompt": "x"}, "files": {"input_reference": ("a.png", b"\x89PNG")}}
    yield "GET", "/v1/videos/abc/content", {}
    yield "GET", f"/v1/videos/{job_id}/content", {"params": {"variant": "spritesheet"}}


def test_malformed_requests_get_4xx_never_5xx(server):
    job = server.submit(prompt="ok", num_inference_steps=1)
    cases = list(_malformed(job["id"]))
    assert len(cases) >= 30
    for method, path, kwargs in cases:
        r = server.client.request(method, path, **kwargs)
        assert 400 <= r.status_code < 500, (method, path, kwargs.get("json"), r.status_code, r.text[:300])
    named = server.client.post("/generate", json={"prompt": "x", "height": 17}).json()
    assert "height" in json.dumps(named) and "16..256" in json.dumps(named)
    server.wait_job(job["id"])
    assert server.client.get("/health").status_code == 200


def test_openai_sdk_create_retrieve_list_download(server, tmp_path):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key)
    video = client.videos.create(prompt="a paper boat on a pond", seconds="1", size="84x44")
    assert video.object == "video" and video.status == "queued"
    assert video.size == "80x48"  # the nearest multiples of 16, as the reply says
    (warning,) = video.to_dict()["warnings"]  # the tiny model's workers publish its vocabulary
    assert warning.startswith("the model does not know the words paper, boat, on, pond: it draws coloured")
    while (video := client.videos.retrieve(video.id)).status not in ("completed", "failed"):
        time.sleep(0.05)
    assert video.status == "completed" and video.progress == 100 and video.completed_at is not None
    assert video.id in [v.id for v in client.videos.list(limit=5).data]
    content = client.videos.download_content(video.id)
    (tmp_path / "o.mp4").write_bytes(content.read())
    frames = iio.imread(tmp_path / "o.mp4")
    assert frames.shape[1:3] == (48, 80) and frames.shape[0] == 17  # 1 s at 16 fps → 4k+1 frames
    deleted = client.videos.delete(video.id)
    assert deleted.deleted and server.client.get(f"/jobs/{video.id}").status_code == 404


def test_openai_errors_have_openai_shape(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError) as bad:
        client.videos.create(prompt="a boat", seconds="-3")
    assert "seconds" in bad.value.message and bad.value.body["param"] == "seconds"
    with pytest.raises(openai.UnprocessableEntityError) as big:  # the tiny model makes at most 256×256
        client.videos.create(prompt="a boat", seconds="1", size="1280x720")
    assert big.value.body["param"] == "size" and "width 16 to 256 in steps of 16" in big.value.message
    with pytest.raises(openai.NotFoundError) as missing:
        client.videos.retrieve("0" * 32)
    assert missing.value.body["type"] == "not_found_error"
    with pytest.raises(openai.AuthenticationError) as denied:
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).videos.list()
    assert "API key" in denied.value.message
    native = server.client.get("/jobs/" + "0" * 32)  # the native API keeps FastAPI's {"detail": ...}
    assert native.status_code == 404 and "detail" in native.json()


def _switches(srv: ServerProcess) -> int:
    lines = srv.client.get("/metrics").text.splitlines()
    return int(next(line for line in lines if line.startswith("ithaca_lora_switches_total ")).split()[-1])


def test_a_job_names_a_lora_of_the_catalogue(server, tmp_path):
    """The session server's --lora-dir (one LoRA, `glow`): listed by /loras; a job naming it completes with
    its set in its spec and a video other than the base's; with `glow` applied, a later job of it is claimed
    before an older one without (the queue's preference), and that one gives the base's frames again (the
    weights restored); /metrics counts the two switches; an unknown name is a 422."""
    listed = server.client.get("/loras").json()
    assert listed["data"] == [{"name": "glow", "experts": False, "fits": True, "error": None}]
    bad = server.client.post("/generate", json={"prompt": "fox", "loras": [{"name": "nope"}]})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "loras"], bad.text
    before = _switches(server)
    request = dict(prompt="a green square moving left", num_frames=9, height=48, width=80,
                   num_inference_steps=4, seed=3)  # fmt: skip
    glow = [{"name": "glow", "strength": 1.0}]
    base = server.wait_job(server.submit(**request)["id"])
    first = server.submit(**request, loras=glow)
    wait_until(lambda: server.client.get(f"/jobs/{first['id']}").json()["status"] != "queued", 30, "a claim")
    plain, again = server.submit(**request), server.submit(**request, loras=glow)  # plain is older
    jobs = [server.wait_job(job["id"]) for job in (first, plain, again)]
    assert all(job["status"] == "completed" for job in [base, *jobs]), jobs
    assert [job["request"].get("loras") for job in jobs] == [[["glow", 1.0]], None, [["glow", 1.0]]]
    assert jobs[2]["started_at"] < jobs[1]["started_at"]  # glow was applied: `again` went first
    frames = []
    for k, job in enumerate([base, *jobs]):
        (tmp_path / f"{k}.mp4").write_bytes(server.client.get(job["video_url"]).content)
        frames.append(iio.imread(tmp_path / f"{k}.mp4").astype(float))
    base_frames, first_frames, plain_frames, again_frames = frames
    assert abs(first_frames - base_frames).mean() > 2  # glow changes the frames by ~6 (0-255)
    assert (plain_frames == base_frames).all() and (again_frames == first_frames).all()
    wait_until(lambda: _switches(server) == before + 2, 10, "both switches in /metrics")
