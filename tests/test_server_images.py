"""The first-frame image of an image-to-video model through the server: /generate (multipart file part or a
data URL in JSON) and /v1/videos (`input_reference`), the checks at the door (413, 415, 422 naming the
field), the image kept as sent beside the job and removed with it. In-process: the ASGI app, no worker group,
an image-to-video model's limits published as a worker would (the worker's side:
test_server_images_worker.py)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os

import numpy as np
import pytest
from fastapi.testclient import TestClient

from dit.image import ImageError, UnsupportedFormat, read
from dit.pipeline import TINY_LIMITS
from server import images, videos
from server.app import create_app
from server.config import ServeConfig
from server.middleware import GuardMiddleware
from server.store import JobStore
from testing.images import DESCRIBED, PNG, data_url, encoded, stripes
from testing.published import publish, published_app

SETTINGS = {"max_image_bytes": 100_000, "max_image_pixels": 200_000}  # the default body limit, 64 KiB


def _client(tmp_path, *, image: bool | None):
    """A client of an app whose published model takes an image (True), refuses one (False), or that no
    worker has published limits for yet (None)."""
    model = None if image is None else dataclasses.replace(TINY_LIMITS, image=image)
    return TestClient(published_app(tmp_path, model, **SETTINGS), raise_server_exceptions=False)


@pytest.fixture
def i2v(tmp_path):
    with _client(tmp_path, image=True) as c:
        yield c


def _inputs(tmp_path) -> list[str]:
    folder = tmp_path / "videos" / "inputs"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def _error(r) -> tuple[str, str]:
    """(field, message) of an error in either shape."""
    body = r.json()
    if "error" in body:
        return body["error"]["param"], body["error"]["message"]
    return body["detail"][0]["loc"][-1], body["detail"][0]["msg"]


# -- submitting an image -------------------------------------------------------------------------------------


def test_multipart_and_data_url_submits_keep_the_image_and_describe_it(i2v, tmp_path):
    form = i2v.post("/generate", data={"prompt": "fox", "num_frames": "9"}, files={"image": ("a.png", PNG)})
    assert form.status_code == 202, form.text
    assert form.json()["request"] == {
        "prompt": "fox",
        "negative_prompt": "",
        "num_frames": 9,
        "seed": form.json()["request"]["seed"],  # drawn at random (none was sent)
        "image": DESCRIBED,
    }
    as_json = i2v.post("/generate", json={"prompt": "fox", "image": data_url(PNG)})
    assert as_json.status_code == 202 and as_json.json()["request"]["image"] == DESCRIBED, as_json.text
    assert "base64" not in i2v.get(f"/jobs/{as_json.json()['id']}").text  # a description, never pixels
    jobs = [form.json()["id"], as_json.json()["id"]]
    assert _inputs(tmp_path) == sorted(f"{j}.png" for j in jobs)
    assert np.array_equal(read(videos.input_path(str(tmp_path / "videos"), jobs[0])), stripes())


def test_the_submit_routes_leave_room_for_an_image_in_the_body(i2v, tmp_path):
    """An image near --max-image-bytes fits under the default 64 KiB body limit on the two submit routes,
    as a file part and as a data URL; other routes keep the plain limit."""
    noise = np.random.default_rng(3).integers(0, 256, (180, 180, 3), dtype=np.uint8)
    big = encoded(noise)
    assert 65536 < len(big) <= SETTINGS["max_image_bytes"]
    r = i2v.post("/generate", data={"prompt": "fox"}, files={"image": ("big.png", big)})
    assert r.status_code == 202, r.text
    r = i2v.post("/generate", json={"prompt": "fox", "image": data_url(big)})
    assert r.status_code == 202, r.text
    r = i2v.post("/v1/videos", data={"prompt": "fox"}, files={"input_reference": ("big.png", big)})
    assert r.status_code in (200, 202), r.text
    r = i2v.post("/jobs/x/cancel", content=b"x" * 70000, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "image" not in r.text, r.text
    # an image far past its limit fills the body before it is read: the limit is said (it read as the
    # body's size alone)
    huge = b"x" * (3 * SETTINGS["max_image_bytes"])
    r = i2v.post("/generate", data={"prompt": "fox"}, files={"image": ("huge.png", huge)})
    limit = f"an image may be at most {SETTINGS['max_image_bytes']} bytes (--max-image-bytes)"
    assert r.status_code == 413 and limit in r.json()["detail"], r.text
    # a data URL in a form's text part, as long as one (Starlette's own limit on a part is 1 MB, ours 64 KiB)
    r = i2v.post("/generate", files={"prompt": (None, "fox"), "image": (None, data_url(big))})
    assert r.status_code == 202 and r.json()["request"]["image"]["width"] == 180, r.text
    for form in (
        {"data": {"prompt": "fox", "input_reference": data_url(big)}},
        {"files": {"prompt": (None, "fox"), "input_reference": (None, data_url(big))}},
    ):
        r = i2v.post("/v1/videos", **form)
        assert r.status_code == 200, r.text


def test_a_json_body_may_pass_the_body_limit_by_its_image_alone(i2v):
    """Past --max-body-bytes (64 KiB), a JSON body owes the rest to one data URL, wherever it stands."""
    url = data_url(encoded(np.random.default_rng(3).integers(0, 256, (180, 180, 3), dtype=np.uint8)))
    assert len(url) > 65536
    for body in (
        {"prompt": "fox", "image": url, "seed": 1},
        {"image": url, "prompt": "fox"},
    ):
        assert i2v.post("/generate", json=body).status_code == 202
    assert i2v.post("/v1/videos", json={"prompt": "fox", "input_reference": url}).status_code == 200
    for body in (
        {"prompt": "x" * 70_000},  # no image
        {"prompt": "fox", "image": url, "negative_prompt": "y" * 66_000},  # an image, and more
        {"prompt": 'a: "data:' + "x" * 70_000 + '"'},  # quoted inside a string: no value of its own
    ):
        for path in ("/generate", "/v1/videos"):
            r = i2v.post(path, content=json.dumps(body), headers={"content-type": "application/json"})
            assert r.status_code == 413 and "only an image" in r.text, (path, r.text)


def test_a_large_json_body_is_parsed_with_its_data_url_cut_out(monkeypatch):
    """The parser walks the fields around a large body's data URL, not the image: json.loads' result."""
    url = "data:image/png;base64," + "A" * 2_000_000
    parsed, loads = [], json.loads
    monkeypatch.setattr(
        images.json, "loads", lambda text, **kw: parsed.append(len(text)) or loads(text, **kw)
    )
    for body in (
        {"prompt": "fox", "image": url, "seed": 1},
        {"image": url},
        {"prompt": 'a: "data:' + "x" * 1000 + '"', "image": url},  # a quoted data: inside a string first
        {"input_reference": url, "model": "m"},
    ):
        text = json.dumps(body).encode()
        assert images.parse_json(text) == body and max(parsed[-1:]) < 2000, body
    for text in (  # escaped, not ASCII, nested, not an object: parsed whole, still right
        json.dumps({"image": url.replace("base64,", "base64\\/,")}).encode(),
        json.dumps({"image": url + "ÿ"}, ensure_ascii=False).encode(),
        json.dumps({"image": [url]}).encode(),
        json.dumps([url]).encode(),
    ):
        assert images.parse_json(text) == json.loads(text)


def test_a_large_body_without_an_image_is_refused_unread():
    """The guard reads a JSON body without an image up to the plain limit and a chunk, not the 27 MB."""
    reads, sent = [], []

    async def receive():
        reads.append(1)
        return {"type": "http.request", "body": b'{"prompt": "' + b"x" * 65536, "more_body": True}

    async def send(message):
        sent.append(message)

    async def app(scope, receive, send):
        raise AssertionError("the app got the body")

    guard = GuardMiddleware(
        app, api_key=None, max_body_bytes=65536, upload_bytes=28_000_000, upload_paths=("/generate",)
    )
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/generate",
        "headers": [(b"content-length", b"27000000"), (b"content-type", b"application/json")],
    }
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 413 and len(reads) == 1  # its first 64 KiB chunk passes the limit


def test_jpeg_and_webp_are_kept_as_sent(i2v, tmp_path):
    """The bytes the client sent, named for their format: never re-encoded (a camera JPEG stays its size)."""
    for fmt, media_type, suffix in (("JPEG", "image/jpeg", ".jpg"), ("WEBP", "image/webp", ".webp")):
        data = encoded(stripes(), fmt)
        r = i2v.post("/generate", json={"prompt": "fox", "image": data_url(data, media_type)})
        assert r.status_code == 202, r.text
        path = videos.input_path(str(tmp_path / "videos"), r.json()["id"])
        assert path.endswith(r.json()["id"] + suffix) and open(path, "rb").read() == data
        stored = read(path)
        assert stored.shape == (40, 160, 3) and np.abs(stored.astype(int) - stripes()).mean() < 10


def test_data_urls():
    data = encoded(np.zeros((4, 4, 3), np.uint8))
    text = base64.b64encode(data).decode()
    assert images.from_data_url(f"data:image/png;base64,{text}") == data
    assert images.from_data_url(f"DATA:Image/JPEG;base64,{text}") == data  # the media type is only checked
    assert images.from_data_url(f"data:image/jpg;base64,{text}") == data  # jpeg's common alias (a 415)
    with pytest.raises(UnsupportedFormat, match="image/gif"):
        images.from_data_url(f"data:image/gif;base64,{text}")
    for bad, says in [
        ("https://example.com/a.png", "must be a data URL"),
        (b"data:image/png;base64,AAAA", "must be a data URL"),
        ("data:image/png,rawtext", "base64-encoded"),
        ("data:image/png;base64,@@@@", "invalid base64"),
        ("data:image/png;base64,AAA", "invalid base64: it must be one line of standard base64, '=' padded"),
        ("data:image/png;base64,ÿÿÿÿ", "invalid base64"),  # not ASCII
    ]:
        with pytest.raises(ImageError, match=says) as e:
            images.from_data_url(bad)
        assert type(e.value) is ImageError


def test_data_urls_are_decoded_in_pieces(monkeypatch):
    monkeypatch.setattr(images, "_B64_CHUNK", 8)
    data = bytes(range(256)) * 3 + b"x"  # ends in padding
    assert images.from_data_url("data:image/png;base64," + base64.b64encode(data).decode()) == data
    with pytest.raises(ImageError, match="invalid base64"):  # padding inside: one image's end, then more
        images.from_data_url("data:image/png;base64,QUFBQQ==QUFB")  # each piece alone is valid


def test_the_idempotency_key_covers_the_image(i2v, tmp_path):
    key = {"Idempotency-Key": "img-1"}
    first = i2v.post("/generate", json={"prompt": "fox", "image": data_url(PNG)}, headers=key)
    again = i2v.post("/generate", data={"prompt": "fox"}, files={"image": ("a.png", PNG)}, headers=key)
    assert again.status_code == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = encoded(np.full((8, 8, 3), 7, np.uint8))
    conflict = i2v.post("/generate", json={"prompt": "fox", "image": data_url(other)}, headers=key)
    assert conflict.status_code == 409 and first.json()["id"] in conflict.json()["detail"]
    assert _inputs(tmp_path) == [f"{first.json()['id']}.png"]  # the replay and the conflict left no file


GIF = data_url(encoded(stripes(), "GIF"), "image/png")  # what the bytes are decides, not the label
NOISE = encoded(np.random.default_rng(0).integers(0, 255, (200, 200, 3), np.uint8))  # > 100 000 bytes
WIDE = encoded(np.zeros((400, 600, 3), np.uint8))  # 240 000 pixels in a few hundred bytes


@pytest.mark.parametrize(
    "image,status,says",
    [
        ("data:image/png;base64,aGVsbG8=", 422, "not an image"),
        ("https://example.com/a.png", 422, "must be a data URL"),
        ("data:image/png;base64,@@@", 422, "invalid base64"),
        ("data:image/png;base64,ÿÿÿÿ", 422, "invalid base64"),
        ("data:image/gif;base64,R0lGODlh", 415, "send PNG, JPEG or WebP"),
        (GIF, 415, "the image is GIF"),
        (data_url(NOISE), 413, "at most 100000 are accepted"),
        (data_url(WIDE), 413, "600x400 (240000 pixels); at most 200000"),
    ],
)
def test_bad_images_are_refused_naming_the_field(i2v, tmp_path, image, status, says):
    """The same check on both routes and both ways of sending, in each route's error shape."""
    png_url = image.startswith("data:image/png;base64,") and says != "invalid base64"
    raw = base64.b64decode(image.split(",")[1]) if png_url else None
    requests = [("/generate", {"json": {"prompt": "fox", "image": image}}, "image")]
    requests.append(("/v1/videos", {"json": {"prompt": "fox", "input_reference": image}}, "input_reference"))
    if raw is not None:
        requests.append(("/generate", {"data": {"prompt": "fox"}, "files": {"image": ("a", raw)}}, "image"))
        files = {"input_reference": ("a.png", raw)}
        requests.append(("/v1/videos", {"data": {"prompt": "fox"}, "files": files}, "input_reference"))
    for path, kwargs, field in requests:
        r = i2v.post(path, **kwargs)
        assert r.status_code == status and _error(r)[0] == field and says in _error(r)[1], (path, r.text)
    assert _inputs(tmp_path) == [] and i2v.get("/jobs").json()["data"] == []


def test_an_image_to_video_model_needs_an_image(i2v):
    for path, field in (("/generate", "image"), ("/v1/videos", "input_reference")):
        r = i2v.post(path, json={"prompt": "fox"})
        assert r.status_code == 422 and _error(r) == (
            field,
            "the model generates from a first-frame image: send one (PNG, JPEG or WebP)",
        ), r.text


def test_a_text_to_video_model_refuses_an_image(tmp_path):
    with _client(tmp_path, image=False) as t2v:
        r = t2v.post("/generate", data={"prompt": "fox"}, files={"image": ("a.png", PNG)})
        assert r.status_code == 422 and _error(r) == (
            "image",
            "the model is text-to-video: it takes no image",
        )
        r = t2v.post("/v1/videos", data={"prompt": "fox"}, files={"input_reference": ("a.png", PNG)})
        assert r.status_code == 422 and _error(r)[0] == "input_reference"
        assert (
            t2v.post("/generate", files={"prompt": (None, "fox"), "num_frames": (None, "9")}).status_code
            == 202
        )
        assert _inputs(tmp_path) == []


def test_before_any_worker_published_an_image_is_taken_if_it_decodes_within_the_limits(tmp_path):
    with _client(tmp_path, image=None) as bare:
        assert bare.post("/generate", json={"prompt": "fox"}).status_code == 202
        assert bare.post("/generate", json={"prompt": "fox", "image": data_url(PNG)}).status_code == 202
        assert bare.post("/generate", json={"prompt": "fox", "image": data_url(WIDE)}).status_code == 413


def test_a_first_frame_that_finds_the_disk_full_is_a_503_and_leaves_nothing(i2v, tmp_path, monkeypatch):
    from dit import files

    real = files.os.replace

    def full(src, dst):  # the input's bytes are in, its rename finds no room (an inode, a directory block)
        if "inputs" in str(dst):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", full)
    for url, field in (("/generate", "image"), ("/v1/videos", "input_reference")):
        r = i2v.post(url, data={"prompt": "fox"}, files={field: ("a.png", PNG)})
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "the results folder's disk is full" in r.text
    assert _inputs(tmp_path) == [] and i2v.get("/jobs").json()["data"] == []


def test_multipart_fields_are_checked_as_json_ones(i2v):
    files = {"image": ("a.png", PNG)}
    r = i2v.post("/generate", data={"prompt": "fox", "num_frames": "many"}, files=files)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "num_frames"], r.text
    r = i2v.post("/generate", data={"prompt": "fox", "height": "17"}, files=files)  # the published limits
    assert r.status_code == 422 and _error(r)[0] == "height" and "16..256" in r.text
    r = i2v.post("/generate", data={"prompt": "fox", "colour": "red"}, files=files)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "extra_forbidden"
    assert _error(r)[1].startswith("unknown field 'colour'; allowed: ['cache', 'fps', "), r.text
    r = i2v.post("/generate", files={"prompt": ("p.txt", b"fox"), "image": ("a.png", PNG)})
    assert r.status_code == 422 and _error(r) == ("prompt", "'prompt' cannot be a file; only image can")
    r = i2v.post("/generate", files={"prompt": (None, "fox"), "image": (None, data_url(PNG))})  # a text part
    assert r.status_code == 202 and r.json()["request"]["image"] == DESCRIBED
    for url in ("/generate", "/v1/videos"):  # which of two was meant is not for the server to guess
        r = i2v.post(url, files=[("prompt", (None, "fox")), ("prompt", (None, "owl")), ("seed", (None, "1"))])
        assert r.status_code == 422 and _error(r) == ("prompt", "'prompt' is given 2 times; give it once")
        body = b'{"prompt": "fox", "seed": 1, "prompt": "owl", "prompt": "cat"}'  # JSON's last one was taken
        r = i2v.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422 and _error(r) == ("prompt", "'prompt' is given 3 times; give it once")
    nested = b'{"prompt": "fox", "loras": [{"name": "a", "name": "b"}]}'  # said where it is (it read "name")
    r = i2v.post("/generate", content=nested, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "loras", 0, "name"], r.text


def test_openai_input_reference(i2v, tmp_path):
    r = i2v.post(
        "/v1/videos", data={"prompt": "fox", "seconds": "1"}, files={"input_reference": ("a.png", PNG)}
    )
    assert r.status_code == 200 and r.json()["object"] == "video", r.text
    assert i2v.get(f"/jobs/{r.json()['id']}").json()["request"]["image"] == DESCRIBED
    as_json = i2v.post("/v1/videos", json={"prompt": "fox", "input_reference": data_url(PNG)})
    assert as_json.status_code == 200, as_json.text
    assert _inputs(tmp_path) == sorted([f"{r.json()['id']}.png", f"{as_json.json()['id']}.png"])
    r = i2v.post("/v1/videos", data={"prompt": "fox"}, files={"size": ("s", b"64x64")})
    assert r.status_code == 422 and r.json()["error"]["param"] == "size"


def test_the_input_is_removed_with_its_job_and_kept_by_a_cancel(i2v, tmp_path):
    kept, deleted = (
        i2v.post("/generate", json={"prompt": "fox", "image": data_url(PNG)}).json()["id"] for _ in "ab"
    )
    assert i2v.delete(f"/jobs/{kept}").json()["status"] == "cancelled"  # cancelled, still listed
    assert i2v.delete(f"/v1/videos/{deleted}").status_code == 200  # deleted
    assert _inputs(tmp_path) == [f"{kept}.png"]


def test_sweep_removes_the_inputs_of_deleted_jobs_that_are_over(tmp_path):
    store = JobStore(str(tmp_path / "jobs.db"))
    folder = str(tmp_path / "videos")
    done, gone, running = (store.create({"prompt": p})[0] for p in "abc")
    for _ in range(3):
        store.claim("w", "box")
    store.finish(done.id, "w", "completed", video=f"{done.id}.mp4")
    store.finish(gone.id, "w", "completed", video=f"{gone.id}.mp4")
    for job in (gone, running):
        store.cancel(job.id, delete=True)  # the running one may still be re-queued: its input stays
    for job_id, media_type in ((done.id, "image/png"), (gone.id, "image/jpeg"), (running.id, "image/webp")):
        videos.write_input(folder, job_id, b"image", media_type)
    videos.write_input(folder, "0" * 32, b"png", "image/png")
    assert videos.sweep(store, folder) == [f"{gone.id}.jpg"]
    assert _inputs(tmp_path) == sorted([f"{done.id}.png", f"{running.id}.webp", "0" * 32 + ".png"])


def test_openapi_shows_the_image_field_and_its_rule(i2v):
    doc = i2v.get("/openapi.json").json()
    body = doc["paths"]["/generate"]["post"]["requestBody"]["content"]
    assert {"application/json", "multipart/form-data"} <= set(body)
    image = doc["components"]["schemas"]["GenerateBody"]["properties"]["image"]["description"]
    assert image.startswith("required: the model's first frame, image/png, image/jpeg, image/webp")
    assert (
        "input_reference"
        in doc["paths"]["/v1/videos"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"][
            "properties"
        ]
    )


def test_v1_names_the_size_the_model_makes_of_the_image(tmp_path):
    """A model that sizes a video from its image (HunyuanVideo-1.5 image-to-video): /v1 answers with the
    size its worker will pick before any worker has the job (tiny-joint-i2v's target 64 and PNG's 1:4: 128x32,
    as test_hunyuan_i2v's run makes it); a size sent is kept."""
    config = ServeConfig(workers=False, data_dir=str(tmp_path), preset="tiny-joint-i2v", **SETTINGS)
    limits = dataclasses.replace(TINY_LIMITS, image=True, image_target_size=64)
    with TestClient(create_app(config)) as client:
        publish(client.app.state.services.store, limits, config.image_limits, model="tiny-joint-i2v")
        sized = client.post("/v1/videos", data={"prompt": "fox"}, files={"input_reference": ("a.png", PNG)})
        asked = client.post(
            "/v1/videos", data={"prompt": "fox", "size": "64x64"}, files={"input_reference": ("a.png", PNG)}
        )
    assert sized.status_code == asked.status_code == 200, (sized.text, asked.text)
    assert (sized.json()["size"], asked.json()["size"]) == ("128x32", "64x64")
