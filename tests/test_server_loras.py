"""LoRAs per request on the HTTP side, in-process (the ASGI app with a published catalogue): GET /loras and
/limits, the `loras` field of /generate (JSON and multipart) and of /v1/videos (JSON, and the official SDK's
extra_body as its multipart flattens it), 422s naming the field, the OpenAPI document, and the
`ithaca_lora_switches_total` series."""

from __future__ import annotations

import dataclasses
import json

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from dit.pipeline import TINY_LIMITS
from server import metrics
from testing.published import LORA_CATALOGUE as CATALOGUE
from testing.published import TINY_RANDOM_TOKENS, publish, tiny_random_app

pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # the SDK's notice


@pytest.fixture
def client(tmp_path):
    with TestClient(tiny_random_app(tmp_path, loras=CATALOGUE), raise_server_exceptions=False) as c:
        yield c


def _loras(client, job_id: str):
    return client.app.state.services.store.get(job_id).spec.get("loras")


def test_the_catalogue_is_listed_and_names_what_a_request_may_use(client):
    listed = client.get("/loras").json()
    assert listed == {"catalogue": True, "max_strength": 4.0, "data": CATALOGUE}
    assert client.get("/limits").json()["loras"] == CATALOGUE
    fields = client.get("/openapi.json").json()["components"]["schemas"]["GenerateBody"]["properties"]
    assert fields["loras"]["items"]["properties"]["name"] == {"enum": ["style"]}  # only what fits
    assert fields["loras"]["items"]["properties"]["strength"]["maximum"] == 4.0


def test_generate_takes_loras_as_json_and_as_multipart_parts(client):
    r = client.post("/generate", json={"prompt": "fox", "loras": [{"name": "style", "strength": 0.5}]})
    assert r.status_code == 202, r.text
    assert _loras(client, r.json()["id"]) == [["style", 0.5]] == r.json()["request"]["loras"]
    r = client.post("/generate", json={"prompt": "fox", "loras": [{"name": "style"}]})  # strength 1
    assert _loras(client, r.json()["id"]) == [["style", 1.0]]
    r = client.post("/generate", json={"prompt": "fox", "loras": []})
    assert "loras" not in r.json()["request"]  # none: the spec reads as before
    part = json.dumps({"name": "style", "strength": -2})
    r = client.post("/generate", files={"prompt": (None, "fox"), "loras": (None, part)})
    assert r.status_code == 202, r.text
    assert _loras(client, r.json()["id"]) == [["style", -2.0]]


@pytest.mark.parametrize(
    "loras, where",
    [
        ([{"name": "nope"}], "no LoRA named 'nope'"),
        ([{"name": "wan22/pair"}], "does not fit the model: a pair for a two-expert model"),
        ([{"name": "style"}, {"name": "style", "strength": 2}], "named more than once"),
        ([{"name": "style", "strength": 4.5}], "less than or equal to 4"),
        ([{"name": "style", "strength": -4.01}], "greater than or equal to -4"),
        ([{"name": "style", "weight": 1}], "Extra inputs"),
        (["style"], "valid dictionary"),
        ({"name": "style"}, "valid list"),
        ([{"strength": 1}], "Field required"),
    ],
)
def test_a_bad_lora_is_a_422_naming_the_field_on_both_routes(client, loras, where):
    r = client.post("/generate", json={"prompt": "fox", "loras": loras})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(d["loc"][:2] == ["body", "loras"] and where in d["msg"] for d in detail), detail
    r = client.post("/v1/videos", json={"prompt": "fox", "loras": loras})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == "loras" and where in r.json()["error"]["message"], r.text


def test_loras_on_a_server_without_a_catalogue_are_refused(tmp_path):
    with TestClient(tiny_random_app(tmp_path), raise_server_exceptions=False) as client:
        assert client.get("/loras").json() == {"catalogue": False, "max_strength": 4.0, "data": []}
        assert client.get("/limits").json()["loras"] is None
        r = client.post("/generate", json={"prompt": "fox", "loras": [{"name": "style"}]})
        assert r.status_code == 422 and "without --lora-dir" in r.text
        assert r.json()["detail"][0]["loc"] == ["body", "loras"]
        doc = client.get("/openapi.json").json()
        assert "loras" not in doc["components"]["schemas"]["GenerateBody"]["properties"]
        for media in doc["paths"]["/v1/videos"]["post"]["requestBody"]["content"].values():
            assert "loras" not in media["schema"]["properties"]


def test_v1_takes_loras_as_json_and_from_the_sdks_extra_body(client):
    r = client.post("/v1/videos", json={"prompt": "fox", "loras": [{"name": "style", "strength": 0.25}]})
    assert r.status_code == 200, r.text
    assert _loras(client, r.json()["id"]) == [["style", 0.25]]
    # the official SDK, in-process: it sends multipart with extra_body flattened to loras[][KEY] fields
    sdk = openai.OpenAI(
        base_url="http://testserver/v1", api_key="-", http_client=_asgi(client), max_retries=0
    )
    extra = {"loras": [{"strength": 0.75, "name": "style"}]}  # either key first
    video = sdk.videos.create(prompt="fox", extra_body=extra)
    assert _loras(client, video.id) == [["style", 0.75]]
    with pytest.raises(openai.UnprocessableEntityError, match="no LoRA named 'other'"):
        sdk.videos.create(prompt="fox", extra_body={"loras": [{"name": "style"}, {"name": "other"}]})


def test_the_sdks_loras_keep_their_strengths(tmp_path):
    """The openai SDK writes every loras[][name], then every loras[][strength]: the second LoRA took the
    first's strength, in silence. Where some LoRA has none, which one a strength is for cannot be told: a 422
    that says how to send them (as JSON, which works)."""
    other = {"name": "other", "experts": False, "fits": True, "error": None}
    with TestClient(tiny_random_app(tmp_path, loras=[*CATALOGUE, other])) as client:
        http = _asgi(client)
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=http, max_retries=0)
        both = [{"name": "style", "strength": 0.5}, {"name": "other", "strength": 2}]
        assert _loras(client, sdk.videos.create(prompt="fox", extra_body={"loras": both}).id) == [
            ["other", 2.0], ["style", 0.5]
        ]  # fmt: skip
        one = [{"name": "other", "strength": 0.5}, {"name": "style"}]
        with pytest.raises(openai.UnprocessableEntityError, match="which LoRA each is for cannot be told"):
            sdk.videos.create(prompt="fox", extra_body={"loras": one})
        video = sdk.videos.create(prompt="fox", extra_body={"loras": json.dumps(one)})
        assert _loras(client, video.id) == [["other", 0.5], ["style", 1.0]]


def test_a_retry_spelling_the_same_request_otherwise_is_the_same_request(tmp_path):
    """The set has one spelling (`validate` sorts it): under the same Idempotency-Key a retry that names the
    LoRAs in another order gets its job, on both routes; it was a 409, another body. So does /v1's `seconds`
    as a number or as the SDK's string."""
    other = {"name": "other", "experts": False, "fits": True, "error": None}
    with TestClient(tiny_random_app(tmp_path, loras=[*CATALOGUE, other])) as client:
        pair = [{"name": "style", "strength": 0.5}, {"name": "other"}]
        for route, key in (("/generate", "k1"), ("/v1/videos", "k2")):
            first, again = (
                client.post(route, json={"prompt": "fox", "loras": loras}, headers={"Idempotency-Key": key})
                for loras in (pair, pair[::-1])
            )
            assert again.status_code == first.status_code and again.json()["id"] == first.json()["id"], route
            assert again.headers["idempotent-replayed"] == "true"
            assert _loras(client, first.json()["id"]) == [["other", 1.0], ["style", 0.5]]
        # a retry after the LoRA it names left the catalogue still gets its job (a 422 "no LoRA named")
        services = client.app.state.services
        limits = dataclasses.replace(TINY_LIMITS, max_prompt_tokens=TINY_RANDOM_TOKENS)
        publish(services.store, limits, services.config.image_limits, loras=CATALOGUE)
        services._worker_info = (0.0, {})  # read the catalogue again now, not a second on
        retry, fresh = (
            client.post("/generate", json={"prompt": "fox", "loras": pair}, headers={"Idempotency-Key": key})
            for key in ("k1", "k9")
        )
        assert retry.status_code == 202 and retry.headers["idempotent-replayed"] == "true", retry.text
        assert fresh.status_code == 422 and "no LoRA named 'other'" in fresh.text
        # the SDK's "seconds" string and a JSON number alike (it was a 409 too)
        key = {"Idempotency-Key": "k3"}
        first, again = (
            client.post("/v1/videos", json={"prompt": "fox", "seconds": seconds}, headers=key)
            for seconds in ("1", 1.0)
        )
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text


def _asgi(client: TestClient) -> httpx.Client:
    """An httpx client whose requests the TestClient's app answers."""
    return httpx.Client(transport=httpx.MockTransport(lambda request: _relay(client, request)))


def _relay(client: TestClient, request: httpx.Request) -> httpx.Response:
    reply = client.request(request.method, request.url.path, content=request.read(), headers=request.headers)
    return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)


def test_switches_are_a_counter():
    text = metrics.render(counts={}, counters=metrics.lora_switches(3, 0.5), restarts=0, ready=True)
    assert "ithaca_lora_switches_total 3\n" in text and "ithaca_lora_switch_seconds_total 0.5\n" in text
