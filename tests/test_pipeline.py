"""The pipeline on one process: input checks, seeded determinism, cancellation, MP4 round trip."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import dit.pipeline
from dit.pipeline import (
    DecodeCancelled,
    GenerationCancelled,
    GenerationFailed,
    GenerationRequest,
    PipelineConfig,
    load_pipeline,
)
from dit.video import Mp4Writer, read_mp4, write_mp4
from testing import fake_ffmpeg
from testing.server_process import wait_until
from tests.distributed import run_distributed

SMALL = dict(num_frames=5, height=32, width=48, num_inference_steps=2)


@pytest.fixture(scope="module")
def pipe():
    return load_pipeline(PipelineConfig(model="tiny-random", device="cpu"))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_frames", 10, r"num_frames must be 4k\+1 between 5 and 33, got 10"),
        ("num_frames", 37, r"num_frames must be 4k\+1 between 5 and 33, got 37"),
        ("height", 40, r"height must be a multiple of 16 between 16 and 256, got 40"),
        ("width", 512, r"width must be a multiple of 16 between 16 and 256, got 512"),
        ("num_inference_steps", 0, r"num_inference_steps must be an integer between 1 and 50, got 0"),
        ("guidance_scale", 25.0, r"guidance_scale must be between 1.0 and 20.0, got 25.0"),
        ("guidance_scale", 0.5, r"guidance_scale must be between 1.0 and 20.0, got 0.5"),
        ("fps", 0, r"fps must be an integer between 1 and 60, got 0"),
        ("seed", -1, r"seed must be an integer between 0 and"),
        ("prompt", "", r"prompt must be a non-empty string"),
        ("prompt", "x" * 200, r"prompt is 201 tokens long; the text encoder accepts at most 128"),
        (
            "negative_prompt",
            "y" * 500,
            r"negative_prompt is 501 tokens long; the text encoder accepts at most 128",
        ),
        ("negative_prompt", 5, r"negative_prompt must be a string, got int"),  # a TypeError in the tokenizer
        ("prompt", "a \ud800 cat", r"prompt is not valid text: it holds a lone UTF-16 surrogate"),
    ],
)
def test_bad_inputs_name_the_field_and_allowed_values(pipe, field, value, message):
    req = (
        GenerationRequest(prompt="a cat", **{field: value}) if field != "prompt" else GenerationRequest(value)
    )
    with pytest.raises(ValueError, match=message):
        pipe.validate(req)


def test_two_threads_take_turns(pipe):
    """A pipeline's runs share its scheduler: two at once failed with an IndexError inside it."""
    import threading

    reqs = [GenerationRequest("a cat", **SMALL, seed=seed) for seed in (1, 2)]
    alone = [pipe.generate(req) for req in reqs]
    got = [None, None]

    def run(i):
        got[i] = pipe.generate(reqs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(np.array_equal(a, b) for a, b in zip(alone, got, strict=True))


def test_a_callback_that_calls_back_into_its_pipeline_is_refused(pipe):
    """It ran on the scheduler and decoder of the run it came from: an IndexError, or 14 frames of 17."""
    req = GenerationRequest("a cat", **SMALL)
    alone = pipe.generate(req)
    said = "called from inside a run of the same pipeline"
    with pytest.raises(RuntimeError, match=f"Pipeline.denoise was {said}"):
        pipe.generate(req, callback=lambda step, total: pipe.denoise(req))
    with pytest.raises(RuntimeError, match=f"Pipeline.generate was {said}"):
        pipe.generate(req, on_frames=lambda frames: pipe.generate(req))
    assert np.array_equal(pipe.generate(req), alone)  # whole again


def test_decode_takes_one_videos_latents(pipe):
    latents = pipe.denoise(GenerationRequest("a cat", **SMALL))
    for bad in (torch.cat([latents, latents]), latents[:, :4], latents.numpy()):  # the first video, or deep
        with pytest.raises(ValueError, match=r"decode takes one video's latents \[1, 16, F, H, W\]"):
            pipe.decode(bad)
    latents[0, 0, 0, 0, 0] = float("nan")  # diverged sampling (UniPC at flow shift 1e8): the VAE was blamed
    with pytest.raises(GenerationFailed, match=r"^the denoised latents hold non-finite values: the"):
        pipe.decode(latents)


def test_numpy_numbers_are_taken_as_pythons(pipe):
    """np.int64 (a seed from rng.integers) was refused as "num_frames must be 4k+1 ..., got np.int64(17)", and
    np.float32 guidance too, where np.float64 (a float) was taken and kept."""
    given = GenerationRequest("a cat", num_frames=np.int64(17), height=np.int32(32), width=np.int16(48),
                              seed=np.int64(5), guidance_scale=np.float32(3.0), fps=np.uint8(8))  # fmt: skip
    assert pipe.validate(given) == pipe.validate(
        GenerationRequest("a cat", num_frames=17, height=32, width=48, seed=5, guidance_scale=3.0, fps=8)
    )
    assert type(pipe.validate(given).seed) is int and type(pipe.validate(given).guidance_scale) is float
    with pytest.raises(ValueError, match="seed must be an integer"):  # a bool is no seed, numpy's neither
        pipe.validate(GenerationRequest("a cat", seed=np.bool_(True)))


def test_defaults_come_from_the_limits(pipe):
    lim = pipe.limits
    req = pipe.validate(GenerationRequest("a cat"))
    # None is a field's default for every field (negative_prompt None was a TypeError, seed None refused)
    given_none = GenerationRequest("a cat", negative_prompt=None, seed=None, fps=None)
    assert pipe.validate(given_none) == req and (req.negative_prompt, req.seed) == ("", 0)
    assert (req.num_frames, req.height, req.width) == (
        lim.default_frames,
        lim.default_height,
        lim.default_width,
    )
    assert (req.num_inference_steps, req.guidance_scale, req.fps) == (
        lim.default_steps,
        lim.default_guidance,
        16,
    )
    assert req.num_frames > 1 and (req.num_frames - 1) % lim.frame_step == 0
    assert lim.size_multiple == 16 and lim.max_prompt_tokens == pipe.text_encoder.max_tokens


def test_latent_shape_follows_vae_compression_and_model_channels(pipe):
    req = pipe.validate(GenerationRequest("a cat", num_frames=13, height=48, width=80))
    assert pipe.latent_shape(req) == (1, pipe.model.config.in_channels, 4, 6, 10)


def test_generation_is_seeded(pipe):
    a = pipe.denoise(GenerationRequest("a red fox", seed=3, **SMALL))
    b = pipe.denoise(GenerationRequest("a red fox", seed=3, **SMALL))
    c = pipe.denoise(GenerationRequest("a red fox", seed=4, **SMALL))
    d = pipe.denoise(GenerationRequest("a blue whale", seed=3, **SMALL))
    assert torch.equal(a, b)
    assert not torch.allclose(a, c) and not torch.allclose(a, d)  # the seed and the prompt both matter
    frames = pipe.decode(a)
    assert frames.shape == (5, 32, 48, 3) and frames.dtype == np.uint8
    assert frames.std() > 0  # not a constant image


def test_callback_reports_every_step_and_cancels(pipe):
    seen = []
    pipe.generate(GenerationRequest("a cat", **SMALL), callback=lambda s, n: seen.append((s, n)))
    assert seen == [(1, 2), (2, 2)]
    seen.clear()
    req = GenerationRequest("a cat", **{**SMALL, "num_inference_steps": 5})
    with pytest.raises(GenerationCancelled) as info:
        pipe.generate(req, callback=lambda s, n: seen.append(s) or s < 2)
    assert (info.value.step, info.value.total, seen) == (2, 5, [1, 2])
    # any false answer but None stops (only the object False did: numpy's False ran on to the end), and a
    # list is an answer like any other (it was taken for a batch's rows: a TypeError)
    for stop in (np.False_, torch.tensor(False), 0, []):
        with pytest.raises(GenerationCancelled):
            pipe.generate(req, callback=lambda s, n, stop=stop: stop)
    assert pipe.generate(req, callback=lambda s, n: [True, False]).shape[0] == SMALL["num_frames"]


def _callback_raising_on_the_leader():
    import parallel
    from dit.sampling import after_step

    mesh = parallel.init_parallel(ulysses=2)
    try:
        after_step(lambda step, total: 1 / 0, None, 1, 2, mesh)
    except Exception as e:  # noqa: BLE001 - which one each rank meets is the point
        return type(e).__name__, str(e)


def test_a_callback_that_raises_ends_the_run_on_every_rank():
    """It runs on the replica leader alone: its exception skipped the broadcast the others waited in, and
    they hung until the collective timeout (600 s by default)."""
    leader, other = run_distributed(2, _callback_raising_on_the_leader, timeout=60)
    assert leader == ("ZeroDivisionError", "division by zero")
    assert other == ("GenerationFailed", "the callback raised on the replica leader (rank 0)")


def test_a_decode_callback_sees_each_latent_frame_and_stops_the_decode_at_one(pipe):
    """Asked as each latent frame is decoded, before its frames go on: False stops the decode there."""
    latents = pipe.denoise(GenerationRequest("a cat", **SMALL))  # 5 frames: 2 latent frames (1 + 4 frames)
    asked, pieces = [], []
    whole = pipe.decode(latents, pieces.append, lambda done, frames: asked.append((done, frames)))
    assert asked == [(1, 2), (2, 2)] and [len(p) for p in pieces] == [1, 4]
    asked.clear()
    pieces.clear()
    with pytest.raises(DecodeCancelled, match="while decoding, after latent frame 1 of 2") as info:
        pipe.decode(latents, pieces.append, lambda done, frames: asked.append(done) or done < 1)
    assert isinstance(info.value, GenerationCancelled) and (info.value.frame, info.value.frames) == (1, 2)
    assert asked == [1] and pieces == []  # the stopped chunk's frames are not handed on
    assert np.array_equal(pipe.decode(latents), whole)  # a stopped decode leaves the VAE as it was


def test_mp4_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(9, 48, 80, 3), dtype=np.uint8)
    path = write_mp4(frames, tmp_path / "v.mp4", fps=12)
    video = read_mp4(path)
    assert video.frames.shape == (9, 48, 80, 3)
    assert (video.fps, video.codec, video.pix_fmt) == (12.0, "h264", "yuv420p")


def test_mp4_rejects_bad_frames(tmp_path):
    with pytest.raises(ValueError, match="frames must be uint8"):
        write_mp4(np.zeros((3, 16, 16), np.uint8), tmp_path / "v.mp4", fps=8)
    with pytest.raises(ValueError, match="must be even"):
        write_mp4(np.zeros((3, 15, 16, 3), np.uint8), tmp_path / "v.mp4", fps=8)
    # ffmpeg's own words for these ("exit code 234: Error opening input files"), or a black video
    with pytest.raises(ValueError, match="^frames must be uint8 .*, got float32$"):
        write_mp4(np.ones((3, 16, 16, 3), np.float32), tmp_path / "v.mp4", fps=8)
    for fps in (0, -1, float("nan"), True):
        with pytest.raises(ValueError, match="^fps must be a number of frames a second above 0"):
            write_mp4(np.zeros((3, 16, 16, 3), np.uint8), tmp_path / "v.mp4", fps=fps)
    with pytest.raises(ValueError, match="^path must end in .mp4, got '.*v.txt'$"):
        write_mp4(np.zeros((3, 16, 16, 3), np.uint8), tmp_path / "v.txt", fps=8)
    assert list(tmp_path.iterdir()) == []


def test_an_mp4_written_chunk_by_chunk_is_the_whole_one(tmp_path):
    """`Mp4Writer` takes frames as a decode makes them: the same video as one write; a with-block that fails
    leaves no file."""
    frames = np.random.default_rng(1).integers(0, 256, size=(9, 32, 48, 3), dtype=np.uint8)
    whole = read_mp4(write_mp4(frames, tmp_path / "whole.mp4", fps=8)).frames
    with Mp4Writer(tmp_path / "chunks.mp4", 32, 48, fps=8) as writer:
        for chunk in (frames[:1], frames[1:5], frames[5:]):  # Wan's decode: 1 frame, then 4 per latent frame
            writer.write(chunk)
    assert writer.frames == 9 and np.array_equal(read_mp4(writer.path).frames, whole)
    with pytest.raises(RuntimeError), Mp4Writer(tmp_path / "cancelled.mp4", 32, 48, fps=8) as writer:
        writer.write(frames[:1])
        raise RuntimeError("cancelled")
    assert not (tmp_path / "cancelled.mp4").exists()
    with (
        pytest.raises(ValueError, match=r"frames must be uint8 \[n, 32, 48, 3\]"),
        Mp4Writer(tmp_path / "bad.mp4", 32, 48, fps=8) as writer,
    ):
        writer.write(frames[:, :16])


@pytest.mark.parametrize(
    "failure,said",
    [
        (
            fake_ffmpeg.DIES_MID_WRITE,
            "ffmpeg ended with exit code 1: Error writing output: No space left on device",
        ),
        # after the last frame: a file that no player opens, which the old close took for done
        (
            fake_ffmpeg.FAILS_AT_CLOSE,
            "ffmpeg ended with exit code 1: [out#0/mp4] Error closing file: No space left on device",
        ),
        (fake_ffmpeg.STALLS, "ffmpeg did not finish the file within 0.5 s of its last frame"),
        # the decode (and the group's other ranks in it) waited on a full pipe until --job-timeout
        (fake_ffmpeg.STALLS_MID_WRITE, "ffmpeg did not take the next frames within 0.5 s"),
    ],
    ids=["dies-mid-write", "fails-at-close", "stalls", "stalls-mid-write"],
)
def test_an_mp4_that_cannot_be_written_is_one_line_at_the_close_and_no_file(
    tmp_path, monkeypatch, failure, said
):
    """ffmpeg gone mid-write reaches the writer as a broken pipe: `write` keeps it (a decode goes on, its
    other ranks with it); ffmpeg's exit is checked at the close, which raises VideoNotWritten in one line
    (ffmpeg's own last one), and the file goes; an ffmpeg that stalls, mid-file or at the close, is ended."""
    from dit import video as video_mod

    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg.fake_ffmpeg(tmp_path, failure))
    monkeypatch.setattr(video_mod, "STALL_S", 0.5)
    frames = np.zeros((5, 96, 128, 3), np.uint8)  # 4 frames fill a pipe's 64 KiB
    with pytest.raises(video_mod.VideoNotWritten) as e, Mp4Writer(tmp_path / "v.mp4", 96, 128, 8) as writer:
        writer.write(frames[:1])
        writer.write(frames[1:])  # the decode's next chunk: nothing raised mid-decode
    assert str(e.value) == f"the MP4 was not written: {said}"
    assert not (tmp_path / "v.mp4").exists()


def test_an_mp4_is_written_by_a_process_holding_many_files(tmp_path):
    """ffmpeg's pipe as descriptor 1024 or past it (a busy server's): select.select refused it, and the
    video failed with "filedescriptor out of range in select()"."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        # the case holds 1030 files and more, so that ffmpeg's pipe gets a descriptor past 1023
        pytest.skip(f"a process here may hold at most {hard} files; the case needs 1100")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held = []
    try:
        while not held or held[-1] < 1030:
            held.append(os.open(os.devnull, os.O_RDONLY))
        frames = np.zeros((9, 96, 128, 3), np.uint8)  # past a pipe's 64 KiB: a write waits for ffmpeg
        with Mp4Writer(tmp_path / "v.mp4", 96, 128, fps=8) as writer:
            assert writer._ffmpeg.stdin.fileno() > 1024
            writer.write(frames)
        assert read_mp4(writer.path).frames.shape == frames.shape
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_ctrl_c_while_ffmpeg_finishes_leaves_no_file_and_no_ffmpeg(tmp_path, monkeypatch):
    """The with-block ended, and the close waited for ffmpeg: a Ctrl-C there left the partial file and
    ffmpeg running (the command had said "no video written")."""
    monkeypatch.setenv("IMAGEIO_FFMPEG_EXE", fake_ffmpeg.fake_ffmpeg(tmp_path, fake_ffmpeg.STALLS))
    with pytest.raises(KeyboardInterrupt), Mp4Writer(tmp_path / "v.mp4", 32, 48, 8) as writer:
        writer.write(np.zeros((5, 32, 48, 3), np.uint8))
        ffmpeg, wait, calls = writer._ffmpeg, writer._ffmpeg.wait, []

        def interrupted(timeout=None):  # the Ctrl-C lands while the close waits; then waits as it would
            calls.append(timeout)
            if len(calls) == 1:
                raise KeyboardInterrupt
            return wait(timeout)

        monkeypatch.setattr(ffmpeg, "wait", interrupted)
    assert ffmpeg.returncode is not None and not (tmp_path / "v.mp4").exists()


def test_ffmpeg_dies_with_the_process_that_started_it(tmp_path):
    """A rank killed (kill -9, the out-of-memory killer) left its ffmpeg running: one stalled on its disk
    wrote its partial MP4 later, beside the video of the job's next run."""
    import subprocess
    import sys

    env = os.environ | {"IMAGEIO_FFMPEG_EXE": fake_ffmpeg.fake_ffmpeg(tmp_path, fake_ffmpeg.STALLS_MID_WRITE)}
    code = ("import sys, time, numpy as np; from dit.video import Mp4Writer; "
            "w = Mp4Writer(sys.argv[1], 32, 48, 8); w.write(np.zeros((9, 32, 48, 3), np.uint8)); "
            "print(w._ffmpeg.pid, flush=True); time.sleep(60)")  # fmt: skip
    caller = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "v.mp4")], env=env,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    ffmpeg = int(caller.stdout.readline())
    caller.kill()
    caller.wait()

    def gone() -> bool:  # no process, or one that died unreaped (a container's init may not reap)
        try:
            return open(f"/proc/{ffmpeg}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
        except FileNotFoundError:
            return True

    wait_until(gone, 10, "ffmpeg's end")


def test_tiny_text_encoder_pads_like_wan(pipe):
    enc = pipe.text_encoder
    emb = enc.encode("  a   cat ")  # cleaned to "a cat": 5 bytes + end token
    assert emb.shape == (1, enc.max_tokens, pipe.model.config.text_dim)
    assert enc.tokenizer.count_tokens("  a   cat ") == 6
    assert emb[0, :6].abs().sum(-1).min() > 0 and emb[0, 6:].abs().max() == 0


@pytest.mark.parametrize(
    "settings, says",
    [
        (dict(attn_backend="fast"), "attn_backend 'fast' is not one of auto, flash, cudnn, sdpa, math, fp8"),
        (dict(quant="bogus"), "quant 'bogus' is not one of none, fp8"),  # it loaded unquantised
        # what the command line refused and Python loaded, to fail later and elsewhere
        (dict(flow_shift=-1.0), "flow_shift must be a number above 0"),  # "the VAE decode ... overflow"
        (dict(flow_shift="3"), "flow_shift must be a number above 0"),  # a numpy UFuncTypeError
        (dict(attn_backend="flash"), "attn_backend flash needs a CUDA device"),  # "'NoneType' ... callable"
        (dict(attn_backend="cudnn"), "attn_backend cudnn needs a CUDA device"),  # ran as plain SDPA
        (dict(comm="bogus"), "comm 'bogus' is not one of alltoall"),
        (dict(cache="bogus"), "cache must be off, fbcache, or fbcache:THRESHOLD"),  # every request failed
        (dict(offload_idle_expert=True), "offload_idle_expert is for two-expert models"),
        (dict(loras="x.safetensors"), "loras must be \\(path, strength\\) pairs, got 'x.safetensors'"),
        (dict(loras=[("x.safetensors", float("nan"))]), "loras x.safetensors: the strength must be a finite"),
        (dict(preview_every=1.5), "preview_every must be an integer of 0 \\(none\\) or more, got 1.5"),
        (dict(preview_every="2"), "preview_every must be an integer"),  # a TypeError at load
        (dict(compile="yes"), "compile must be True or False, got 'yes'"),  # it compiled
        (dict(parallel_decode="no"), "parallel_decode must be True or False, got 'no'"),  # taken as True
        (dict(comm=None), "comm None is not one of alltoall"),  # "'NoneType' object has no attribute"
        (dict(model=None), "model must be a preset's name or a folder, got None"),  # pathlib's TypeError
        (dict(loras=[("x.safetensors", 10**400)]), "loras x.safetensors: the strength must be a finite"),
        (dict(loras=(("x.safetensors", "abc"),)), "loras must be"),  # "could not convert string to float"
        (dict(timesteps=[1000, 750]), "timesteps must be text"),  # "'list' object has no attribute 'split'"
    ],
)
def test_settings_are_checked_as_the_command_line_checks_them(settings, says):
    with pytest.raises(ValueError, match=f"^{says}"):
        load_pipeline(PipelineConfig(**{"model": "tiny-random", "device": "cpu", **settings}))


def test_what_is_no_config_or_request_is_said_so(pipe):
    """A dict, a string or None: an AttributeError from deep inside (`validate` alone said it)."""
    with pytest.raises(TypeError, match="^load_pipeline takes a PipelineConfig, got dict$"):
        load_pipeline({"model": "tiny"})
    for wrong in ({"prompt": "x"}, "a red circle", None):
        with pytest.raises(TypeError, match="^a request is a GenerationRequest, got "):
            pipe.generate(wrong)
    # hooks too, before the run: they failed after the text encoding, deep in the sampler
    req = GenerationRequest("a red circle", num_inference_steps=1)
    for hooks, says in ((dict(callback=5), "callback must be callable, got 5"),
                        (dict(on_frames="x"), "on_frames must be callable"),
                        (dict(checkpoints=5), "checkpoints takes a Checkpointing, got 5")):  # fmt: skip
        with pytest.raises(TypeError, match=f"^{says}"):
            pipe.generate(req, **hooks)


def test_numpy_settings_are_taken_as_pythons():
    load_pipeline(
        PipelineConfig(model="tiny-random", device="cpu", flow_shift=np.float32(3.0), compile=np.False_)
    )


def test_a_model_folder_may_be_a_path():
    from dit.presets import SHIPPED

    assert load_pipeline(PipelineConfig(model=Path(SHIPPED["tiny"]), device="cpu")).limits.default_steps == 12


def test_attn_backend_is_applied(monkeypatch):

    import parallel.kernels

    math_calls = []
    real_math = parallel.kernels._math
    monkeypatch.setattr(parallel.kernels, "_math", lambda *a: math_calls.append(1) or real_math(*a))
    req = GenerationRequest("a red fox", **SMALL)
    by_backend = {
        b: load_pipeline(PipelineConfig(model="tiny-random", device="cpu", attn_backend=b)).denoise(req)
        for b in ("sdpa", "math")
    }
    # Self- and cross-attention both reach the math kernel: 2 kinds × 2 layers × 2 steps × (prompt, negative).
    assert len(math_calls) == 2 * 2 * 2 * 2
    torch.testing.assert_close(by_backend["math"], by_backend["sdpa"], rtol=1e-5, atol=1e-5)


def test_text_encoder_device_is_its_own(monkeypatch):
    """`text_encoder_device` places the text encoder apart from the DiT (e.g. host memory on a GPU box)."""
    from dataclasses import replace

    from dit.families import model_family, register_family

    family, devices = model_family("tiny"), []
    # the meta device (no machine's) shows where the text encoder goes; the settings check would refuse it
    monkeypatch.setattr(dit.pipeline, "check_settings", lambda config, **named: False)

    def placed(folder, model, tokenizer, dtype, device):
        devices.append(torch.device(device))
        return family.text_encoder(folder, model, tokenizer, dtype, "cpu")

    register_family(replace(family, text_encoder=placed))
    try:
        load_pipeline(PipelineConfig(model="tiny-random", device="cpu", text_encoder_device="meta"))
        load_pipeline(PipelineConfig(model="tiny-random", device="cpu"))
    finally:
        register_family(family)
    assert devices == [torch.device("meta"), torch.device("cpu")]


def test_recent_prompts_are_encoded_once(pipe, monkeypatch):
    """The leader keeps recent prompts' text conditioning (`dit.text_cache`): a negative prompt shared by
    jobs is encoded once, and the video is the one a fresh encoding gives."""
    from dit.text_cache import TextCache

    encoded, condition = [], pipe.text_encoder.condition
    monkeypatch.setattr(pipe.text_encoder, "condition", lambda text: encoded.append(text) or condition(text))
    monkeypatch.setattr(pipe, "texts", TextCache())
    fox, whale = (
        GenerationRequest(p, negative_prompt="blurry", guidance_scale=3.0, **SMALL)
        for p in ("a fox", "a whale")
    )
    pipe.denoise(fox)
    cached = pipe.denoise(whale)
    assert encoded == ["a fox", "blurry", "a whale"] and pipe.texts.hits == 1
    monkeypatch.setattr(pipe, "texts", TextCache(max_bytes=0))  # keeps nothing
    assert torch.equal(pipe.denoise(whale), cached) and encoded[3:] == ["a whale", "blurry"]


def test_the_text_cache_is_bounded_in_bytes():
    from dit.text_cache import TextCache

    cache = TextCache(max_bytes=3 * 4 * 8)  # three float32 [8] states
    state = {text: {"states": torch.full((8,), float(i))} for i, text in enumerate("abcde")}
    for text in "abca":  # "a" is the most recent now; "b" the least
        cache.get(text, state.get)
    cache.get("d", state.get)  # evicts "b"
    assert list(cache._entries) == ["c", "a", "d"] and cache.bytes == 96
    assert cache.get("e", lambda text: {"big": torch.zeros(100)})["big"].numel() == 100  # too big: not kept
    assert list(cache._entries) == ["c", "a", "d"]
