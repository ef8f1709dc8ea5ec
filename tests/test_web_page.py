"""The web page (`GET /`) in a real browser: Playwright driving Debian's Chromium (/usr/bin/chromium, never
a downloaded one) against real `ithaca serve` processes running the TRAINED TINY MODEL: the session's
`tiny_server` (tests/conftest.py: one worker group of 2 ranks under a server with an API key), and a second
API process without a key attached to the same store.
Without a key: submit from the page (with a LoRA row), the progress bar moves, a preview shows, the finished
MP4 plays from its URL. With one: the page asks for the key, the same flow works through blob: URLs, and a
running job is cancelled. Screenshots go to pytest's tmp_path."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from dit.pipeline import TINY_LIMITS
from server.app import create_app
from server.config import ServeConfig
from server.store import open_store
from testing.published import LORA_CATALOGUE, publish
from testing.server_process import ServerProcess

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed"),
    pytest.mark.slow,
]
KEY = "web-page-key"
WAIT_MS = 30_000  # every browser wait (a tiny job takes a few seconds on 2 busy cores)

# Records every aria-valuenow a progress bar takes and every preview that rendered, from before the submit.
# What the page went through for the job of `prompt`: its bar's values (the other cards' were mixed in, the
# session's earlier jobs at 100), and the previews loaded.
RECORDER = """(prompt) => {
    window.seen = {progress: [], previews: []};
    new MutationObserver((changes) => {
        for (const c of changes) {
            if (c.target.getAttribute("aria-label") !== `Progress of “${prompt}”`) continue;
            window.seen.progress.push(Number(c.target.getAttribute("aria-valuenow")));
        }
    }).observe(document.getElementById("jobs"), {subtree: true, attributeFilter: ["aria-valuenow"]});
    document.addEventListener("load", (e) => {  // load does not bubble: caught on its way down
        if (e.target.matches?.("img.preview")) window.seen.previews.push(e.target.naturalWidth);
    }, true);
}"""

REFRESH_MS = 5000  # app.js's: the job list and the limits are read again this often

# Holds every /jobs listing the page asks for until window.release(), each then answered with the first one's
# (older) list: how a refresh asked for while a job ran comes back after the job's stream said it is done.
HOLD_THE_LISTS = """() => {
    const fetch0 = window.fetch;
    const waiting = [];
    window.fetch = (url, options) => {  // each answered as of its asking, handed over at the release (all
        // got the first one's answer: a refresh asked after the job's end read its progress of before)
        if (!String(url).includes("/jobs?")) return fetch0(url, options);
        const answer = fetch0(url, options);
        return new Promise((ok) => waiting.push(ok)).then(() => answer);
    };
    window.release = () => {
        window.fetch = fetch0;
        waiting.forEach((ok) => ok());
        return new Promise((ok) => setTimeout(ok, 300));  // the page reads them
    };
}"""

# The mean difference per channel (0-255) between the <video>'s poster and the frame it shows, both drawn at
# the video's size.
POSTER_VS_FRAME = """async (v) => {
    const image = new Image();
    image.src = v.poster;
    await image.decode();
    const pixels = (source) => {
        const canvas = document.createElement("canvas");
        [canvas.width, canvas.height] = [v.videoWidth, v.videoHeight];
        const context = canvas.getContext("2d");
        context.drawImage(source, 0, 0, canvas.width, canvas.height);
        return context.getImageData(0, 0, canvas.width, canvas.height).data;
    };
    const [a, b] = [pixels(image), pixels(v)];
    let sum = 0;
    for (let i = 0; i < a.length; i++) if (i % 4 !== 3) sum += Math.abs(a[i] - b[i]);
    return sum / (a.length * 3 / 4);
}"""
# The middle frame through WebP and H.264: about 1 (tiny model, 2026-11-24); the last live preview (the
# poster before) differs from it by 6-16.
MAX_POSTER_DIFFERENCE = 4


@pytest.fixture(scope="module")
def servers(tiny_server):
    """(open, keyed): the session's tiny-model server with an API key, and a second API process without a key
    attached to the same store (--no-workers), so both ways the page works cost no group of their own."""
    opened = ServerProcess(tiny_server.data_dir, "--no-workers", "--instance", "web-open")
    try:
        opened.wait()
        yield opened, tiny_server
    finally:
        opened.stop()


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A page whose console errors (a file that failed to load, a script error) fail the test; a 401 is the
    page asking for the key."""
    context = browser.new_context(viewport={"width": 960, "height": 720})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors = []
    page.on(
        "console",
        lambda m: m.type == "error" and "(Unauthorized)" not in m.text and errors.append(m.text),
    )
    page.on("pageerror", lambda e: errors.append(str(e)))
    yield page
    context.close()
    assert not errors, errors


def _contrast(one: str, other: str) -> float:
    """WCAG's contrast ratio of two #rrggbb colours."""

    def luminance(colour: str) -> float:
        channels = [int(colour.lstrip("#")[i : i + 2], 16) / 255 for i in (0, 2, 4)]
        r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels)
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    light, dark = sorted((luminance(one), luminance(other)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def _submit(page, prompt: str, **fields) -> None:
    page.get_by_label("Prompt", exact=True).fill(prompt)
    for label, value in fields.items():
        page.get_by_label(label, exact=True).fill(str(value))
    page.get_by_role("button", name="Generate").click()
    page.locator("li.job", has_text=prompt).wait_for()


def _watch_to_the_video(page, prompt: str, shot) -> dict:
    """Waits for the job's MP4 to play in its <video>; returns what the page went through."""
    card = page.locator("li.job", has_text=prompt).first
    video = card.locator("video")
    video.wait_for(state="visible")
    duration = video.evaluate(
        "v => v.duration > 0 ? v.duration : new Promise((ok, fail) => {"
        " v.addEventListener('loadedmetadata', () => ok(v.duration)); v.addEventListener('error', () =>"
        " fail(new Error('cannot play: ' + (v.error && v.error.message))))})"
    )
    assert duration > 0
    played = video.evaluate(
        "v => { v.muted = true; return v.play().then(() => new Promise((ok) => {"
        " const check = () => v.currentTime > 0 && ok(v.currentTime);"
        " v.addEventListener('timeupdate', check); v.addEventListener('ended', check); })) }"
    )
    assert played > 0
    video.evaluate(  # a frame from the middle, for the screenshot
        "v => { v.pause(); v.currentTime = v.duration / 2;"
        " return new Promise((ok) => v.addEventListener('seeked', ok, {once: true})) }"
    )
    poster_vs_frame = video.evaluate(POSTER_VS_FRAME)
    bar = card.get_by_role("progressbar")
    assert bar.get_attribute("aria-valuenow") == "100"
    assert card.get_by_role("link", name="Download MP4").get_attribute("href")
    assert not card.get_by_role("button", name="Cancel").is_visible()
    page.screenshot(path=shot, full_page=True)
    return page.evaluate("window.seen") | {"duration": duration, "poster_vs_frame": poster_vs_frame}


def test_generate_on_the_tiny_model(servers, page, tmp_path):
    opened, _ = servers
    page.goto(opened.url)
    page.wait_for_function("() => !document.getElementById('generate').disabled")
    limits = opened.client.get("/limits").json()
    assert limits["model"] == "tiny" and limits["defaults"]["num_frames"] == 17
    steps = page.get_by_label("Steps", exact=True)
    spec = limits["limits"]["num_inference_steps"]
    assert (steps.get_attribute("min"), steps.get_attribute("max")) == (str(spec["min"]), str(spec["max"]))
    frames = page.get_by_label("Frames", exact=True)
    assert frames.input_value() == "17" and frames.get_attribute("step") == "4"
    assert page.get_by_label("First frame image").is_hidden()  # a text-to-video model
    hint = page.locator("#prompt-hint")  # the tiny model declares its vocabulary: the hint lists it
    assert "coloured shapes moving on black" in hint.inner_text() and " triangle " in hint.inner_text()
    page.get_by_label("Prompt", exact=True).fill("a red fox in snow")
    assert hint.inner_text().startswith("It does not know: fox, in, snow.")
    page.evaluate(RECORDER, "a red circle moving right")
    page.get_by_role("button", name="Add LoRA").click()  # the session server's catalogue: `glow`
    assert page.get_by_label("LoRA 1", exact=True).input_value() == "glow"
    # enough steps (the tiny model's are ~0.1 s) that the bar is seen between 0 and 100
    _submit(page, "a red circle moving right", Steps=24, Seed=3, **{"Strength of LoRA 1": 0.5})
    card = page.locator("li.job", has_text="a red circle moving right")
    assert " · seed 3 · " in card.inner_text()
    page.evaluate(HOLD_THE_LISTS)
    page.evaluate("() => { showPage(0); }")  # asked for while the job waits or runs; answered once it is done
    card.locator("video").wait_for(state="visible")
    page.evaluate("release()")
    shot = tmp_path / "tiny.png"
    seen = _watch_to_the_video(page, "a red circle moving right", shot)
    if os.environ.get("ITHACA_WEB_SCREENSHOT"):  # how docs/web-page.png is made: 64 colours keep it small
        Image.open(shot).convert("RGB").quantize(64).save(os.environ["ITHACA_WEB_SCREENSHOT"], optimize=True)
    assert any(0 < v < 100 for v in seen["progress"]), seen
    assert set(seen["progress"][seen["progress"].index(100) :]) == {100}, seen  # no step back from done
    assert seen["previews"] and all(w > 0 for w in seen["previews"]), seen
    assert not hint.inner_text().startswith("It does not know")
    assert seen["poster_vs_frame"] < MAX_POSTER_DIFFERENCE, seen  # the poster is the frame the page shows
    job = opened.client.get("/jobs", params={"limit": 1}).json()["data"][0]
    assert job["request"]["loras"] == [["glow", 0.5]]
    timings = job["timings"]
    print(
        f"progress {seen['progress']}, previews {seen['previews']}, {seen['duration']:.2f} s of video, "
        f"poster vs the frame shown {seen['poster_vs_frame']:.1f}"
    )
    print(f"job timings {timings}")


def test_errors_in_words_and_a_phone_sized_window(servers, browser, tmp_path):
    opened, _ = servers
    phone = 375  # px wide; a mobile page widens its layout viewport (innerWidth) to fit what overflows
    size = {"width": phone, "height": 740}
    context = browser.new_context(viewport=size, is_mobile=True, color_scheme="dark")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        page.goto(opened.url)
        page.wait_for_function("() => !document.getElementById('generate').disabled")
        # dark: the text colours keep WCAG AA's 4.5:1 on the browser's dark page (the light ones read 3.0-3.7)
        for name in ("--muted", "--error", "--warning"):
            colour = page.evaluate(f"getComputedStyle(document.documentElement).getPropertyValue('{name}')")
            assert _contrast(colour.strip(), "#121212") >= 4.5, (name, colour)
        fits = f"document.documentElement.scrollWidth <= {phone}"
        assert page.evaluate(fits)
        page.get_by_label("Prompt", exact=True).fill("x" * 150)  # one long unknown word, named in the hint
        assert "x" * 150 in page.locator("#prompt-hint").inner_text()
        assert page.evaluate(fits)  # it wraps
        page.get_by_label("Prompt", exact=True).fill("")
        seed = page.get_by_label("Seed", exact=True)
        seed.fill(str(2**53 + 1))  # past the integers a page's numbers hold exactly: the browser refuses it
        assert seed.evaluate("i => i.validity.rangeOverflow")
        seed.fill("")
        # keyboard only: type the prompt, Tab to Generate, Enter; a prompt of blanks comes back in words
        page.get_by_label("Prompt", exact=True).focus()
        page.keyboard.type("   ")
        for _ in range(12):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.id") == "generate":
                break
        page.keyboard.press("Enter")
        page.get_by_text("Not queued: prompt: ").wait_for()
        assert "must not be empty or blank" in page.locator("#form-status").inner_text()
        page.get_by_role("button", name="Add LoRA").click()
        page.get_by_label("Strength of LoRA 1", exact=True).fill("")  # left empty: the server's default, 1
        with page.expect_request("**/generate") as sent:
            page.get_by_role("button", name="Generate").click()
        assert sent.value.post_data_json["loras"] == [{"name": "glow"}]
        page.screenshot(path=tmp_path / "phone.png", full_page=True)
    finally:
        context.close()


def test_the_page_asks_for_the_key_and_cancels(servers, page, tmp_path):
    _, keyed = servers
    assert httpx.get(f"{keyed.url}/limits").status_code == 401  # the API stays closed without the key
    page.goto(keyed.url)
    key = page.get_by_label("API key")
    key.wait_for()
    assert page.get_by_role("button", name="Generate").is_disabled()
    key.fill("wrong")
    key.press("Enter")
    page.get_by_text("The server refused that key").wait_for()
    # one a header cannot carry is said so at once: it was kept, and every call failed before it was sent
    # ("Cannot reach the server", the key never asked for again, a reload no help)
    key.fill("ключ")
    key.press("Enter")
    page.get_by_text("An API key is printable ASCII").wait_for()
    assert key.is_visible() and page.evaluate("sessionStorage.getItem('ithaca-api-key')") == "wrong"
    key.fill(keyed.api_key)
    page.get_by_role("button", name="Use key").click()
    page.wait_for_function("() => !document.getElementById('generate').disabled")
    assert page.evaluate("sessionStorage.getItem('ithaca-api-key')") == keyed.api_key

    # a key that stops working (the server's was changed) is asked for again, and the form keeps its values
    page.get_by_label("Prompt", exact=True).fill("a blue square moving up")
    page.get_by_label("Steps", exact=True).fill("16")
    page.evaluate("sessionStorage.setItem('ithaca-api-key', 'stale')")
    page.get_by_role("button", name="Generate").click()
    page.get_by_text("The server refused that key").wait_for()
    key.fill(keyed.api_key)
    key.press("Enter")
    page.evaluate("sessionStorage.setItem('ithaca-api-key', 'ключ')")  # one kept from before: asked again
    page.get_by_role("button", name="Generate").click()
    page.get_by_text("An API key is printable ASCII").wait_for()
    key.fill(keyed.api_key)
    with page.expect_response("**/limits"):
        key.press("Enter")
    assert page.get_by_label("Steps", exact=True).input_value() == "16"
    assert page.get_by_label("Prompt", exact=True).input_value() == "a blue square moving up"
    page.evaluate(RECORDER, "a blue square moving up")
    videos = []
    page.on("request", lambda r: videos.append(r.url) if urlsplit(r.url).path.endswith("/video") else None)
    page.get_by_role("button", name="Generate").click()
    seen = _watch_to_the_video(page, "a blue square moving up", tmp_path / "keyed.png")
    assert any(0 < v < 100 for v in seen["progress"]) and seen["previews"], seen
    # the MP4 streams through a signed link, as the <video> plays it: it was fetched whole with the header
    assert videos and all("signature=" in url for url in videos), videos
    # a browser's clock two hours ahead of the server's finds its fresh links fresh (a download asked for new
    # ones again and again); a download once they ended asks for new ones, once
    download = page.locator("li.job", has_text="a blue square moving up").first.get_by_role(
        "link", name="Download MP4"
    )
    asked = []
    page.on("request", lambda r: asked.append(r.url) if urlsplit(r.url).path.endswith("/links") else None)
    page.evaluate("() => { const real = Date.now; Date.now = () => real() + 7200e3; }")
    with page.expect_download() as fresh:
        download.click()
    assert os.path.getsize(fresh.value.path()) > 1000 and not asked
    page.evaluate("() => cards.forEach((card) => (card.linksUntil = 0))")
    with page.expect_download() as renewed:
        download.click()
    assert "signature=" in renewed.value.url and os.path.getsize(renewed.value.path()) > 1000
    assert len(asked) == 1, asked
    # a key asked for again (the server's was changed) leaves no link signed under the old one: a shown video
    # stayed broken and its download failed, until a reload
    page.evaluate("sessionStorage.setItem('ithaca-api-key', 'stale')")
    page.get_by_role("button", name="Generate").click()
    key.fill(keyed.api_key)
    key.press("Enter")
    with page.expect_download() as again:
        download.click()
    assert len(asked) == 2 and os.path.getsize(again.value.path()) > 1000, asked
    assert seen["poster_vs_frame"] < MAX_POSTER_DIFFERENCE, seen

    _submit(page, "a fox to cancel", Frames=33, Width=128, Height=128, Steps=50)
    card = page.locator("li.job", has_text="a fox to cancel")
    page.wait_for_function(
        "() => [...document.querySelectorAll('li.job')].some(li => li.textContent.includes('a fox to cancel')"
        " && Number(li.querySelector('[role=progressbar]').getAttribute('aria-valuenow')) > 0)"
    )
    card.get_by_role("button", name="Cancel").click()
    card.get_by_text(re.compile(r"^Cancelled after step \d+: no video was made\.$")).wait_for()  # the reason
    # the keyboard's place stays on the card: the button hid itself and the focus went to the page's start
    assert card.locator("h3").evaluate("title => document.activeElement === title")
    assert card.get_by_role("progressbar").get_attribute("aria-valuenow") != "100"
    assert card.locator("video").is_hidden()
    jobs = keyed.client.get("/jobs", params={"limit": 1}).json()["data"]
    assert jobs[0]["request"]["prompt"] == "a fox to cancel" and jobs[0]["status"] == "cancelled"
    page.screenshot(path=tmp_path / "cancelled.png")

    # the list is read again while the page is open: a job sent elsewhere appears, a deleted one goes
    small = {"num_frames": 5, "width": 16, "height": 16, "num_inference_steps": 2}
    assert keyed.client.post("/generate", json={"prompt": "a job from elsewhere", **small}).status_code == 202
    page.locator("li.job", has_text="a job from elsewhere").wait_for()
    assert keyed.client.delete(f"/v1/videos/{jobs[0]['id']}").status_code == 200
    card.wait_for(state="detached")


def test_a_long_queue_leaves_the_page_connections_to_submit(browser, tmp_path):
    """A browser opens 6 connections to a server; an event stream per queued job took them all, and the next
    Generate hung at "Submitting…". An API without workers, the tiny model's limits published: jobs stay
    queued. Then the limits change under the open page."""
    server = ServerProcess(tmp_path, "--no-workers")
    context = browser.new_context()
    try:
        server.wait("/health")
        config = ServeConfig(workers=False, data_dir=str(tmp_path))
        store = open_store(config)
        publish(store, TINY_LIMITS, config.image_limits)
        store.close()
        for i in range(8):
            big = {"seed": 2**63 - 1} if i == 0 else {}  # past 2^53: it showed as 9223372036854776000
            assert server.client.post("/generate", json={"prompt": f"queued {i}"} | big).status_code == 202
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.clock.install()  # the page's timers, run ahead where the test waits for its 5 s refresh

        def refreshed() -> None:
            page.clock.run_for(REFRESH_MS)

        page.goto(server.url)
        page.wait_for_function("() => !document.getElementById('generate').disabled")
        page.get_by_label("Prompt", exact=True).fill("one more")
        page.get_by_role("button", name="Generate").click()
        page.get_by_text("Queued job").wait_for(timeout=10_000)
        page.locator("li.job", has_text="one more").get_by_text("Queued (8 ahead)").wait_for()  # "position 8"
        assert f"seed {2**63 - 1} ·" in page.locator("li.job", has_text="queued 0").inner_text()

        # the limits are read again with the list: a LoRA added to the server's folder shows without a reload;
        # a value half typed, or one the browser flags, stays through the reads (each put it back to the
        # model's default)
        assert page.locator("#loras-field").is_hidden()
        frames, height = page.get_by_label("Frames"), page.get_by_label("Height")
        frames.fill("18")
        height.fill("")
        store = open_store(config)
        publish(store, TINY_LIMITS, config.image_limits, loras=LORA_CATALOGUE)
        store.close()
        refreshed()
        page.get_by_text("1 in the catalogue").wait_for(timeout=10_000)
        assert (frames.input_value(), height.input_value()) == ("18", "")
        page.get_by_role("button", name="Add LoRA").click()  # `style`; then it leaves the catalogue: its row
        store = open_store(config)  # goes (hidden with its field, it was still sent: every Generate refused)
        publish(store, TINY_LIMITS, config.image_limits)
        store.close()
        refreshed()
        page.locator("#loras-field").wait_for(state="hidden", timeout=10_000)
        assert page.locator(".lora-row").count() == 0
        frames.fill(str(TINY_LIMITS.default_frames))
        height.fill(str(TINY_LIMITS.default_height))

        # a restart with another model: a value typed stays, one the page filled in takes the new default;
        # an image the model needs is asked for, and no longer once the next model takes none (the hidden
        # input stayed required and Generate did nothing, without a word)
        page.get_by_label("Width").fill("48")
        steps = page.get_by_label("Steps")
        for model, shown in ((replace(TINY_LIMITS, image=True, default_steps=5), True), (TINY_LIMITS, False)):
            store = open_store(config)
            publish(store, model, config.image_limits)
            store.close()
            refreshed()
            page.locator("#image-field").wait_for(state="visible" if shown else "hidden", timeout=10_000)
            assert page.locator("#image").evaluate("input => input.required") is shown
            assert (
                steps.input_value() == str(model.default_steps)
                and page.get_by_label("Width").input_value() == "48"
            )
        page.get_by_role("button", name="Generate").click()
        page.locator("li.job", has_text="one more").nth(1).wait_for(timeout=10_000)  # sent: nothing blocks it

        # a run queued again starts its previews over: the page kept the dead run's (a later step) and dropped
        # every one of the new run's until it passed that step
        store = open_store(config)
        job = store.claim("w", "box")  # "queued 0", the oldest
        previews = tmp_path / "videos" / "previews"
        previews.mkdir(parents=True, exist_ok=True)
        card = page.locator("li.job", has_text="queued 0")
        for step in (8, 2):
            Image.new("RGB", (8, 8), "red").save(previews / f"{job.id}.webp", "WEBP")
            store.set_preview(job.id, "w", step)
            card.locator(f"img[alt$='at step {step}']").wait_for(timeout=10_000)
            if step == 8:
                store.requeue_or_fail(store.get(job.id), max_attempts=3, reason="its group died")
                card.locator("img").first.wait_for(state="hidden", timeout=10_000)
                assert store.claim("w", "box").id == job.id
        store.set_resumed(job.id, "w", 4, 12)  # its seconds are its last run's: said so
        store.finish(job.id, "w", "completed", video=f"{job.id}.mp4", timings={"total_s": 4.25})
        card.get_by_text("Completed in 4.3 s (its last run) · resumed after step 4").wait_for(timeout=10_000)
        store.close()

        # a job that appears keeps the keyboard's place (the list was rebuilt: the focus went to the page's
        # start); the 11th job makes a second page, and that page emptied by a delete steps back to the first
        # (it said "No jobs yet.")
        waiting = page.locator("li.job", has_text="queued 3").get_by_role("button", name="Cancel")
        waiting.focus()
        assert server.client.post("/generate", json={"prompt": "the eleventh"}).status_code == 202
        refreshed()
        page.locator("li.job", has_text="the eleventh").wait_for(timeout=10_000)
        assert waiting.evaluate("button => document.activeElement === button")
        page.get_by_role("button", name="Older jobs").click()
        page.get_by_text("Page 2").wait_for()
        # the last page disables the button pressed: the focus goes to the other (it fell to the page's start)
        assert page.get_by_role("button", name="Newer jobs").evaluate("b => document.activeElement === b")
        assert (
            page.locator("li.job").count() == 1
            and server.client.delete(f"/v1/videos/{job.id}").status_code == 200
        )
        refreshed()
        page.get_by_text("Page 1").wait_for(timeout=10_000)
        assert page.locator("li.job").count() == 10 and page.locator("#jobs-status").inner_text() == ""

        # an action's error goes once the job moves on (it stayed under "Completed")
        page.route(
            "**/jobs/*",
            lambda route: route.abort() if route.request.method == "DELETE" else route.continue_(),
        )
        other = page.locator("li.job", has_text="queued 1")
        other.get_by_role("button", name="Cancel").click()
        other.get_by_text("Not cancelled: ").wait_for()
        page.unroute("**/jobs/*")
        store = open_store(config)
        claimed = store.claim("w", "box")
        assert claimed.spec["prompt"] == "queued 1"
        store.close()
        other.get_by_text("Not cancelled: ").wait_for(state="hidden", timeout=10_000)
        # a cancel refused (409) once the job's stream said it completed says nothing: it stayed for good
        held = []
        page.route("**/jobs/*", lambda r: held.append(r) if r.request.method == "DELETE" else r.continue_())
        other.get_by_role("button", name="Cancel").click()
        while not held:
            page.wait_for_timeout(50)
        store = open_store(config)
        store.finish(claimed.id, "w", "completed", video=f"{claimed.id}.mp4")
        store.close()
        other.get_by_text("Completed").wait_for(timeout=10_000)
        with page.expect_response(lambda r: r.request.method == "DELETE") as refused:
            held[0].continue_()
        assert refused.value.status == 409
        page.unroute("**/jobs/*")
        page.wait_for_timeout(300)  # the page reads the answer
        assert other.locator("p.error").is_hidden()

        # the server gone: its 3 streams are tried again once a second each, not in a growing storm (each
        # failure armed its own retry of every stream: 2 requests a second grew to 22 in 13 s)
        tries = []
        page.on("request", lambda request: tries.append(request.url) if "/events" in request.url else None)
        server.stop()
        page.wait_for_timeout(10_000)
        assert 10 <= len(tries) <= 45, len(tries)
    finally:
        context.close()
        server.stop()


def test_the_page_is_public_and_limits_wait_for_a_worker(tmp_path):
    app = create_app(ServeConfig(workers=False, data_dir=str(tmp_path), api_key=KEY))
    with TestClient(app) as client:
        page = client.get("/")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert client.head("/").status_code == 200
        files = (
            ("/web/app.js", "text/javascript"),
            ("/web/style.css", "text/css"),
            ("/web/icon.svg", "image/svg"),
        )
        for path, kind in files:
            assert client.get(path).headers["content-type"].startswith(kind)
        assert client.get("/web/missing.js").status_code == 401  # only the page's files are public
        assert client.get("/limits").status_code == 401
        r = client.get("/limits", headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 503 and r.headers["retry-after"] == "2"  # no worker has published yet
        assert "(no worker group has joined yet)" in r.json()["detail"]  # --no-workers: none of its own
