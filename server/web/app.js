"use strict";
// The Ithaca page: a form bounded by the model's published limits (GET /limits) and a paged job list, each
// running job followed through its event stream. Every API call carries the key as any client's does;
// fetch() is used throughout because EventSource, <img src> and <video src> cannot send that header.

const KEY_STORE = "ithaca-api-key";
const PAGE_SIZE = 10;
const REFRESH_MS = 5000; // the job list is read again this often while in view: jobs sent elsewhere appear
// Event streams held at once. A browser opens at most 6 connections to a server (HTTP/1.1), and each stream
// keeps one: the form, the list and the videos need the rest. The cards beyond hear of their job from the list.
const MAX_STREAMS = 3;
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const NUMBERS = ["num_frames", "width", "height", "num_inference_steps", "guidance_scale", "seed"];
const STATUS_WORDS = {
  queued: "Queued",
  in_progress: "Running",
  completed: "Completed",
  failed: "Failed",
  cancelled: "Cancelled",
};
const $ = (id) => document.getElementById(id);

class AuthError extends Error {}

let cursors = [null]; // the `after` cursor of each job page reached so far (page 0: the newest)
let page = 0;
const cards = new Map(); // job id → card (see makeCard)

function apiKey() {
  return sessionStorage.getItem(KEY_STORE);
}

// What a header can carry (the server refuses other keys at its start): a key of other characters made every
// call fail before it was sent, "Cannot reach the server", the key never asked for again, a reload no help.
const KEY_CHARS = /^[\x20-\x7e]+$/;
const KEY_RULE = "An API key is printable ASCII (letters, digits, punctuation, spaces inside); enter it again.";

async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key && !KEY_CHARS.test(key)) {
    sessionStorage.removeItem(KEY_STORE);
    askKey(KEY_RULE);
    throw new AuthError("API key needed");
  }
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    askKey(key ? "The server refused that key; enter it again." : "");
    throw new AuthError("API key needed");
  }
  return response;
}

// An error reply in words: FastAPI's detail is a string or a list of {loc, msg}.
async function errorText(response) {
  let detail;
  try {
    detail = (await response.json()).detail;
  } catch {
    return `HTTP ${response.status}`;
  }
  if (Array.isArray(detail)) {
    return detail.map((d) => (d.loc ? `${d.loc[d.loc.length - 1]}: ` : "") + d.msg).join("; ");
  }
  return String(detail ?? `HTTP ${response.status}`);
}

function askKey(message) {
  const form = $("key-form");
  $("key-error").textContent = message;
  if (form.hidden) {
    $("model").textContent = "This server needs an API key.";
    form.hidden = false;
    $("api-key").focus();
  }
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const key = $("api-key").value.trim();
  if (!KEY_CHARS.test(key)) {
    $("key-error").textContent = KEY_RULE;
    return;
  }
  sessionStorage.setItem(KEY_STORE, key);
  $("api-key").value = "";
  $("key-form").hidden = true;
  // links signed under the key the server had are refused now: a shown video stayed broken, a download failed
  cards.forEach((card) => card.linksUntil != null && (card.linksUntil = 0));
  start();
});

// -- the form ------------------------------------------------------------------------------------------------

// Read at the start until it answers, then again with the job list (`again`: a failure waits for the next
// read): a LoRA file added to the server's folder, or another model after a restart, shows without a reload.
async function loadLimits(again = false) {
  let response;
  try {
    response = await api("/limits");
  } catch (error) {
    if (error instanceof AuthError) return;
    $("model").textContent = `Cannot reach the server (${error.message}); retrying…`;
    if (!again) setTimeout(loadLimits, 2000);
    return;
  }
  if (!response.ok) {
    // 503: no worker has published the limits yet (the model is still loading)
    const waiting = response.status === 503 ? "Waiting for the model to load" : await errorText(response);
    $("model").textContent = `${waiting}; retrying…`;
    if (!again) setTimeout(loadLimits, 1000 * Number(response.headers.get("Retry-After") || 2));
    return;
  }
  applyLimits(await response.json());
}

let limitsRead = false;
let vocabulary = null; // {about, words}: the words a small model knows (null: a model that declares none)

function applyLimits({ model, limits, vocabulary: declared, loras }) {
  $("model").textContent = `Model: ${model}`;
  vocabulary = declared || null;
  hintPrompt();
  applyLoras(loras);
  for (const name of NUMBERS) {
    const spec = limits[name];
    if (!spec) continue; // seed, and any field this model does not publish: only the input's own bounds
    const input = $(name);
    // the same model read again: what the user has there stays, half typed or flagged by the browser (it
    // was put back to the default every read: "1", a pause, then "28" made a width of 6428)
    const shown = JSON.stringify(spec);
    if (input.dataset.spec === shown) continue;
    input.dataset.spec = shown;
    input.min = spec.min;
    input.max = spec.max;
    // HTML counts `step` from `min`, as the published multiple is counted
    input.step = spec.multiple_of || (name === "guidance_scale" ? "any" : 1);
    // read again after a key is entered, or a restart with another model: a value the user typed stays
    // while the model still takes it; one the page filled in becomes this model's default
    const kept = input.dataset.typed === "1" && input.value !== "" && input.checkValidity();
    if (spec.default !== undefined && !kept) input.value = spec.default;
    const every = spec.multiple_of ? ` in steps of ${spec.multiple_of}` : "";
    $(`${name}-hint`).textContent = spec.min === spec.max ? `fixed: ${spec.min}` : `${spec.min}–${spec.max}${every}`;
  }
  const image = limits.image;
  const takesImage = Boolean(image && (image.required || image.optional));
  $("image-field").hidden = !takesImage;
  $("image").required = takesImage && Boolean(image.required); // a hidden required input blocks the submit
  if (takesImage) {
    const input = $("image");
    input.accept = image.formats.join(",");
    const mb = (image.max_bytes / 2 ** 20).toFixed(0);
    $("image-hint").textContent = `${image.required ? "required" : "optional"}: PNG, JPEG or WebP, at most ${mb} MiB`;
  }
  if (!limitsRead) $("generate").disabled = false; // once: a read again must not end a submit's wait
  limitsRead = true;
}

// -- LoRAs: a row per LoRA (a name of the catalogue that fits, a strength), shown when the server has some --

const MAX_STRENGTH = 4;
let loraNames = [];
let loraRows = 0; // rows made so far: each row's labels stay unique

function applyLoras(catalogue) {
  loraNames = (catalogue || []).filter((entry) => entry.fits).map((entry) => entry.name);
  $("loras-field").hidden = loraNames.length === 0;
  // a row whose LoRA left the catalogue goes (hidden, it was still sent, and every Generate was refused);
  // the others are offered what the catalogue holds now
  for (const row of $("lora-rows").querySelectorAll(".lora-row")) {
    const select = row.querySelector("select");
    if (!loraNames.includes(select.value)) {
      row.remove();
      continue;
    }
    const chosen = select.value;
    select.replaceChildren(...loraOptions());
    select.value = chosen;
  }
  const misfits = (catalogue || []).filter((entry) => !entry.fits).map((entry) => entry.name);
  $("loras-hint").textContent =
    `${loraNames.length} in the catalogue, strength −${MAX_STRENGTH} to ${MAX_STRENGTH}` +
    (misfits.length ? `; not for this model: ${misfits.join(", ")}` : "");
}

function loraOptions() {
  return loraNames.map((lora) => element("option", { value: lora }, lora));
}

$("add-lora").addEventListener("click", () => {
  loraRows += 1;
  const row = element("div", { class: "lora-row" });
  const name = element("select", { id: `lora-${loraRows}`, "aria-label": `LoRA ${loraRows}` });
  name.append(...loraOptions());
  const strength = element("input", {
    id: `lora-${loraRows}-strength`,
    type: "number",
    inputmode: "decimal",
    min: -MAX_STRENGTH,
    max: MAX_STRENGTH,
    step: "any",
    value: "1",
    "aria-label": `Strength of LoRA ${loraRows}`,
  });
  const remove = element("button", { type: "button", "aria-label": `Remove LoRA ${loraRows}` }, "Remove");
  remove.addEventListener("click", () => row.remove());
  row.append(name, strength, remove);
  $("lora-rows").append(row);
  name.focus();
});

// A strength left empty is left out: the server's default, 1
function chosenLoras() {
  return [...$("lora-rows").querySelectorAll(".lora-row")].map((row) => {
    const strength = row.querySelector("input").value;
    const name = row.querySelector("select").value;
    return strength === "" ? { name } : { name, strength: Number(strength) };
  });
}

// Under the prompt, for a model that declares its vocabulary: what it draws, its words, and the prompt's
// words it does not know (split as the server's dit.vocabulary splits them: runs of letters, digits and _).
function hintPrompt() {
  const hint = $("prompt-hint");
  if (!vocabulary) {
    hint.textContent = "";
    return;
  }
  const known = new Set(vocabulary.words);
  const words = $("prompt").value.toLowerCase().match(/[\p{L}\p{N}_]+/gu) || [];
  const unknown = [...new Set(words.filter((word) => !known.has(word)))];
  const knows = `This model draws ${vocabulary.about}, from the words: ${vocabulary.words.join(" ")}.`;
  hint.textContent = unknown.length ? `It does not know: ${unknown.join(", ")}. ${knows}` : knows;
  hint.classList.toggle("warning", unknown.length > 0);
}

$("prompt").addEventListener("input", hintPrompt);
for (const name of NUMBERS) $(name).addEventListener("input", () => ($(name).dataset.typed = "1"));

$("generate-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const fields = { prompt: $("prompt").value };
  if ($("negative_prompt").value) fields.negative_prompt = $("negative_prompt").value;
  for (const name of NUMBERS) {
    if ($(name).value !== "") fields[name] = Number($(name).value);
  }
  const loras = chosenLoras();
  if (loras.length) fields.loras = loras;
  const file = $("image-field").hidden ? null : $("image").files[0];
  let body;
  const headers = {};
  if (file) {
    body = new FormData();
    for (const [name, value] of Object.entries(fields)) {
      body.append(name, name === "loras" ? JSON.stringify(value) : String(value)); // loras: one JSON part
    }
    body.append("image", file);
  } else {
    body = JSON.stringify(fields);
    headers["Content-Type"] = "application/json";
  }
  const button = $("generate");
  const status = $("form-status");
  button.disabled = true;
  status.textContent = "Submitting…";
  try {
    const response = await api("/generate", { method: "POST", body, headers });
    if (response.status === 202) {
      const job = await response.json();
      status.textContent = `Queued job ${job.id.slice(0, 8)}.`;
      await showPage(0);
    } else {
      status.textContent = `Not queued: ${await errorText(response)}`;
    }
  } catch (error) {
    status.textContent = error instanceof AuthError ? "Enter the API key, then press Generate again." : `Cannot reach the server: ${error.message}`;
  } finally {
    button.disabled = false;
  }
});

// -- the job list --------------------------------------------------------------------------------------------

// A job's JSON with a seed past 2^53 (the API takes up to 2^63 - 1) kept as its digits: as a JS number it
// showed rounded, a seed that makes another video. Only a key reads `"seed":` (in a string the quote
// after it would be escaped).
function jobJson(text) {
  return JSON.parse(text.replace(/"seed":\s*(\d{16,})/g, '"seed":"$1"'));
}

let listing = 0; // the latest showPage call: an earlier one answered later is dropped

async function showPage(index) {
  const ticket = ++listing;
  const asked = performance.now();
  let response;
  try {
    response = await api(`/jobs?limit=${PAGE_SIZE}` + (cursors[index] ? `&after=${cursors[index]}` : ""));
  } catch (error) {
    if (!(error instanceof AuthError)) $("jobs-status").textContent = `Cannot list the jobs: ${error.message}`;
    return;
  }
  if (!response.ok) {
    $("jobs-status").textContent = `Cannot list the jobs: ${await errorText(response)}`;
    return;
  }
  const { data, has_more, last_id } = jobJson(await response.text());
  if (ticket !== listing) return;
  if (!data.length && index > 0) return showPage(index - 1); // its jobs deleted: it said "No jobs yet."
  page = index;
  cursors = cursors.slice(0, index + 1);
  if (has_more) cursors.push(last_id);
  const shown = new Set(data.map((job) => job.id));
  for (const [id, card] of cards) {
    if (!shown.has(id)) dropCard(card);
  }
  // cards already shown keep their stream, preview and video
  const els = data.map((job) => (cards.get(job.id) || makeCard(job)).el);
  const list = $("jobs");
  // in place: a card taken out and put back (replaceChildren) lost the keyboard's focus at each new job
  for (const child of [...list.children]) if (!els.includes(child)) child.remove();
  els.forEach((el, i) => list.children[i] !== el && list.insertBefore(el, list.children[i] || null));
  for (const job of data) {
    const card = cards.get(job.id);
    // a followed job hears of itself from its own stream, once the list has said where it is: a stream
    // opened by an earlier card's update left its state blank until its first event. A list asked for before
    // the stream's last event is older than the card: a job done meanwhile read "Queued", 0 % again.
    if ((!card.stream || !card.state.textContent) && !(card.heard > asked)) update(card, job);
  }
  $("jobs-status").textContent = data.length ? "" : "No jobs yet.";
  $("page-number").textContent = `Page ${index + 1}`;
  const focused = document.activeElement;
  $("newer").disabled = index === 0;
  $("older").disabled = !has_more;
  // a pager button that disables itself drops the focus to the page's start: the other one takes it
  if (focused && focused.disabled && focused.closest("nav")) ($("newer").disabled ? $("older") : $("newer")).focus();
}

$("newer").addEventListener("click", () => showPage(page - 1));
$("older").addEventListener("click", () => showPage(page + 1));
setInterval(() => {
  if (document.visibilityState !== "visible" || !$("key-form").hidden) return;
  showPage(page);
  if (limitsRead) loadLimits(true); // until the first answer, loadLimits retries by itself
}, REFRESH_MS);

function element(tag, attributes = {}, text = "") {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) el.setAttribute(name, value);
  el.textContent = text;
  return el;
}

function makeCard(job) {
  const title = `job-${job.id}-title`;
  const card = {
    id: job.id,
    created: job.created_at,
    el: element("li", { class: "job", "aria-labelledby": title }),
    status: job.status,
    previewStep: null,
    videoShown: false,
    stream: null, // AbortController of the event stream being read
    heard: 0, // when its stream last told of it (performance.now())
    urls: [], // blob: URLs to revoke when the card goes
    linksUntil: null, // when the links to its video stop opening, performance.now()'s; null: none, or no key
    dropped: false,
  };
  const prompt = job.request.prompt;
  const when = new Date(job.created_at * 1000).toLocaleString();
  const seed = job.request.seed == null ? "" : ` · seed ${job.request.seed}`; // drawn by the server if not sent
  card.el.append(
    element("h3", { id: title, tabindex: "-1" }, prompt), // takes the focus from a Cancel that hides itself
    element("p", { class: "meta" }, `${job.id.slice(0, 8)}${seed} · ${when}`),
  );
  card.state = element("p", { class: "state" });
  card.bar = element("div", {
    role: "progressbar",
    "aria-label": `Progress of “${prompt}”`,
    "aria-valuemin": "0",
    "aria-valuemax": "100",
    "aria-valuenow": "0",
  });
  card.fill = element("div", { class: "fill" });
  card.bar.append(card.fill);
  card.preview = element("img", { class: "preview", alt: "" });
  card.preview.hidden = true;
  card.error = element("p", { class: "error", role: "alert" });
  card.error.hidden = true;
  card.warning = element("p", { class: "warning" }, (job.warnings || []).join(" "));
  card.warning.hidden = !(job.warnings || []).length;
  card.cancel = element("button", { type: "button", "aria-describedby": title }, "Cancel");
  card.cancel.addEventListener("click", () => cancel(card));
  card.video = element("video", { controls: "", preload: "metadata", "aria-label": `Video of “${prompt}”` });
  card.download = element("a", { download: `${job.id}.mp4`, "aria-describedby": title }, "Download MP4");
  card.video.hidden = card.download.hidden = true;
  card.video.addEventListener("error", () => linksStale(card) && renewLinks(card, () => {}));
  card.download.addEventListener("click", (event) => {
    if (!linksStale(card)) return;
    event.preventDefault();
    renewLinks(card, () => card.download.click());
  });
  const media = element("div", { class: "media" });
  media.append(card.preview, card.video);
  card.el.append(card.state, card.warning, card.bar, card.error, media, card.cancel, card.download);
  cards.set(job.id, card);
  return card;
}

function dropCard(card) {
  card.dropped = true;
  if (card.stream) card.stream.abort();
  card.urls.forEach((url) => URL.revokeObjectURL(url));
  cards.delete(card.id);
}

function update(card, job) {
  // an action's error ("Not cancelled: ...") goes once the job has moved on: it stayed under "Completed"
  if (job.status !== card.status && !card.error.hidden) card.error.hidden = true;
  card.status = job.status;
  let state = STATUS_WORDS[job.status] || job.status;
  if (job.status === "queued" && job.queue_position != null) {
    state += job.queue_position ? ` (${job.queue_position} ahead)` : " (next)"; // it said "position 0"
  }
  if (job.status === "in_progress") state += ` · ${job.phase}` + (job.total_steps ? ` · step ${job.step} of ${job.total_steps}` : "");
  if (job.status === "completed" && job.timings && job.timings.total_s != null) {
    // a resumed job's seconds are its last run's: "resumed after step 6 in 4.3 s" read as the whole job's
    const run = job.resumed_from_step != null ? " (its last run)" : "";
    state += ` in ${job.timings.total_s.toFixed(1)} s${run}`;
  }
  if (job.resumed_from_step != null) state += ` · resumed after step ${job.resumed_from_step}`;
  if (job.cancel_requested && !TERMINAL.has(job.status)) state += " · cancelling…";
  card.state.textContent = state;
  card.bar.setAttribute("aria-valuenow", String(job.progress));
  card.bar.setAttribute("aria-valuetext", `${job.progress} %`);
  card.fill.style.width = `${job.progress}%`;
  card.cancel.hidden = TERMINAL.has(job.status) || job.cancel_requested;
  if (job.status === "failed") showError(card, `Failed: ${job.error || "no reason given"}`);
  if (job.status === "cancelled") {
    // the server's reason ("cancelled after step 4"), else the word alone
    const why = job.error ? job.error[0].toUpperCase() + job.error.slice(1) : "Cancelled";
    showError(card, `${why}: no video was made.`);
  }
  if (job.preview_step == null && card.previewStep !== null) {
    // queued again and starting over: the last run's preview (a later step) is not this run's
    card.previewStep = null;
    card.preview.hidden = true;
  }
  // a finished job's preview is its video's poster (showVideo): loaded here too, it was fetched twice
  if (job.preview_step != null && job.status !== "completed") showPreview(card, job.preview_step, job.preview_url);
  if (job.status === "completed") showVideo(card, job);
  followMore();
}

// Opens streams for the jobs shown, up to MAX_STREAMS: the running ones first, then the oldest queued (next to
// start).
function followMore() {
  const all = [...cards.values()];
  const waiting = all.filter((card) => !card.stream && !card.dropped && !TERMINAL.has(card.status));
  const running = (card) => (card.status === "in_progress" ? 0 : 1);
  waiting.sort((a, b) => running(a) - running(b) || a.created - b.created);
  let open = all.filter((card) => card.stream).length;
  for (const card of waiting) {
    if (open >= MAX_STREAMS) break;
    follow(card);
    open += 1;
  }
}

function showError(card, text) {
  card.error.textContent = text;
  card.error.hidden = false;
}

async function blobUrl(card, path) {
  const response = await api(path);
  if (!response.ok) throw new Error(await errorText(response));
  const url = URL.createObjectURL(await response.blob());
  card.urls.push(url);
  return url;
}

async function showPreview(card, step, path) {
  if (card.previewStep !== null && step <= card.previewStep) return;
  card.previewStep = step;
  try {
    const url = await blobUrl(card, path);
    if (card.previewStep !== step) return; // a newer one came meanwhile
    const old = card.preview.getAttribute("src");
    card.preview.src = url;
    card.preview.alt = `Preview of “${card.el.querySelector("h3").textContent}” at step ${step}`;
    card.preview.hidden = card.videoShown; // once the video shows, its poster is a frame of it (showVideo)
    if (old) {
      URL.revokeObjectURL(old);
      card.urls = card.urls.filter((kept) => kept !== old);
    }
  } catch (error) {
    if (!(error instanceof AuthError)) card.previewStep = null; // a later event tries again
  }
}

// The video streams from its URL, read by ranges as it plays. With a key, from a link that opens it without the
// header (a <video> or a download cannot send one) until `card.linksUntil`: the MP4 was fetched whole into
// memory for every finished card shown, and again on each page flip.
async function showVideo(card, job) {
  if (card.videoShown) return;
  card.videoShown = true;
  try {
    // a finished job's preview is its video's middle frame (the worker puts it in place before completing)
    const { video_url, preview_url } = apiKey() ? await links(card) : job;
    card.video.poster = preview_url || "";
    card.video.src = card.download.href = video_url;
    card.video.hidden = card.download.hidden = false;
    card.preview.hidden = true;
  } catch (error) {
    card.videoShown = false;
    if (!(error instanceof AuthError)) showError(card, `Cannot load the video: ${error.message}`);
  }
}

async function links(card) {
  const response = await api(`/jobs/${card.id}/links`);
  if (!response.ok) throw new Error(await errorText(response));
  const got = await response.json();
  if (got.expires_at != null) {
    // their end on the page's own clock: a browser's clock an hour ahead of the server's made fresh links
    // stale, and a download asked for new ones again and again; one behind kept dead ones
    const serverNow = Date.parse(response.headers.get("Date")) || Date.now();
    card.linksUntil = performance.now() + got.expires_at * 1000 - serverNow;
  }
  return got;
}

function linksStale(card) {
  return card.linksUntil != null && performance.now() > card.linksUntil - 60000;
}

// Links an hour old are asked for again: the video goes on from where it stood, a download starts.
async function renewLinks(card, then) {
  try {
    const { video_url } = await links(card);
    const at = card.video.currentTime;
    card.video.src = card.download.href = video_url;
    card.video.addEventListener("loadedmetadata", () => (card.video.currentTime = at), { once: true });
    then();
  } catch (error) {
    if (!(error instanceof AuthError)) showError(card, `Cannot load the video: ${error.message}`);
  }
}

async function cancel(card) {
  card.cancel.disabled = true;
  try {
    const response = await api(`/jobs/${card.id}`, { method: "DELETE" });
    if (response.ok) update(card, jobJson(await response.text()));
    // the job ended before the cancel reached it, as its stream said meanwhile: the 409 stayed under "Completed"
    else if (!TERMINAL.has(card.status)) showError(card, `Not cancelled: ${await errorText(response)}`);
  } catch (error) {
    if (!(error instanceof AuthError)) showError(card, `Not cancelled: ${error.message}`);
  } finally {
    card.cancel.disabled = false;
  }
  // the keyboard's place stays on the card (a hidden button dropped it to the page's start)
  if (card.cancel.hidden && document.activeElement === document.body) card.el.querySelector("h3").focus();
}

// Server-Sent Events read with fetch (EventSource cannot send the key): `progress` and `done` carry the job,
// `preview` the step and URL of a newer preview, `deleted` that the job is gone (through /v1/videos). A
// dropped stream is opened again (followMore) while the job runs; a stream that ends frees its place.
async function follow(card) {
  const controller = new AbortController();
  card.stream = controller;
  try {
    const response = await api(`/jobs/${card.id}/events`, { signal: controller.signal });
    if (response.status === 404) return deleted(card); // deleted before the stream opened: nothing to retry
    if (!response.ok) throw new Error(await errorText(response));
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        handleEvent(card, buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  } catch (error) {
    if (error.name === "AbortError" || error instanceof AuthError) return;
    card.state.textContent = `Lost the job's updates (${error.message}); retrying…`;
  } finally {
    if (card.stream === controller) card.stream = null;
  }
  if (card.dropped || TERMINAL.has(card.status)) setTimeout(followMore, 0); // its place is free
  else retryStreams();
}

// One retry of the dropped streams a second later, however many dropped: each armed its own, and with the
// server down every one of them retried every stream (2 requests a second grew to 22 in 13 s).
let retrying = null;
function retryStreams() {
  if (retrying !== null) return;
  retrying = setTimeout(() => {
    retrying = null;
    followMore();
  }, 1000);
}

function handleEvent(card, block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) name = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  if (!data.length) return;
  const payload = jobJson(data.join("\n"));
  if (name === "preview") showPreview(card, payload.step, payload.url);
  else if (name === "progress" || name === "done") {
    card.heard = performance.now();
    update(card, payload);
  }
  else if (name === "deleted") deleted(card);
}

function deleted(card) {
  card.dropped = true; // no stream is opened again
  card.cancel.hidden = true;
  card.state.textContent = "Deleted: the job and its files are gone.";
}

function start() {
  loadLimits();
  showPage(0);
}

start();
