"""Denoising checkpoints (dit/denoise_state.py): a generation resumed from any step's checkpoint ends with the
same latents, bit for bit on the CPU, as one that never stopped: every sampler (UniPC's multistep history,
renoise's generator), the two-expert model across its switch, and 2 ranks (gloo). Files round-trip through
`torch.load(weights_only=True)`; a file of another key, format or a torn one is refused with the reason."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from dit.denoise_state import Checkpointing, DenoiseState, Expected, load_file, save_file
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from tests.distributed import run_distributed

REQUEST = dict(prompt="a red circle moving left", num_frames=5, height=32, width=32, num_inference_steps=6,
               guidance_scale=3.0, seed=11)  # fmt: skip


def _pipe(model="tiny", sampler=None, ulysses=None):
    import parallel

    mesh = parallel.init_parallel(ulysses=ulysses)
    return load_pipeline(PipelineConfig(model=model, device="cpu", sampler=sampler), mesh)


def _run(pipe, req, resume=None, every=1) -> tuple[torch.Tensor, list[DenoiseState]]:
    saved: list[DenoiseState] = []
    latents = pipe.denoise(req, resume=resume, checkpoints=Checkpointing(every, saved.append))
    return latents, saved


@pytest.mark.parametrize("sampler", ["unipc", "euler", "renoise"])
def test_every_step_resumes_to_the_same_latents(sampler):
    pipe, req = _pipe(sampler=sampler), GenerationRequest(**REQUEST)
    want, saved = _run(pipe, req)
    steps = REQUEST["num_inference_steps"]
    assert [s.step for s in saved] == list(range(1, steps))  # none after the last step
    for state in saved:
        got, _ = _run(pipe, req, resume=state)
        assert torch.equal(got, want), (sampler, state.step)
    assert (pipe.evaluations.evaluated, pipe.evaluations.skipped) == (2 * steps, 0)  # resumed counts kept
    # a state of another request's steps or size: it ran on past the last step, or made the state's size
    for other, why in (({"num_inference_steps": 2}, "step 2 is not 1 to 1"), ({"height": 48}, "of shape")):
        with pytest.raises(ValueError, match=f"^resume: the state does not fit this request: .*{why}"):
            pipe.denoise(GenerationRequest(**REQUEST | other), resume=saved[1])
    with pytest.raises(TypeError, match="^resume takes a DenoiseState .*got {'step': 4}"):  # "vars()"
        pipe.denoise(req, resume={"step": 4})
    # fewer steps, or more, past the state's: it went on to the state's own last step (6 of 4, or 4 of 8)
    with pytest.raises(ValueError, match=r"made for another request \(num_inference_steps differ\)"):
        pipe.denoise(GenerationRequest(**REQUEST | {"num_inference_steps": 8}), resume=saved[1])
    unstamped = replace(saved[1], request=None)  # made before states were stamped, or by hand
    with pytest.raises(ValueError, match="made for another schedule"):
        pipe.denoise(GenerationRequest(**REQUEST | {"num_inference_steps": 8}), resume=unstamped)
    # another prompt's, seed's: of the same size and steps, it resumed into a video of neither
    with pytest.raises(ValueError, match=r"made for another request \(prompt, seed differ\)"):
        pipe.denoise(GenerationRequest(**REQUEST | {"prompt": "a blue square", "seed": 9}), resume=saved[1])
    if sampler == "unipc":  # a state of its history on a sampler of none: 2.19 off, said nothing
        with pytest.raises(ValueError, match="resume: the state does not fit this request"):
            _pipe(sampler="euler").denoise(req, resume=saved[1])
    else:  # one class, one schedule, every attribute alike: the other's video (6.4 off), said nothing
        other = "renoise" if sampler == "euler" else "euler"
        with pytest.raises(ValueError, match="made by another sampler .*stochastic_sampling"):
            _pipe(sampler=other).denoise(req, resume=saved[1])


def test_every_n_steps_and_the_two_experts_across_their_switch():
    pipe = _pipe(model="tiny-moe-random")
    req = GenerationRequest(**REQUEST | {"num_inference_steps": 10})
    want, saved = _run(pipe, req, every=3)
    assert [s.step for s in saved] == [3, 6, 9]
    switch = next(i for i, t in enumerate(pipe.scheduler.timesteps) if t < pipe.boundary * 1000)
    assert 6 <= switch < 9, switch  # checkpoints before the low-noise expert takes over, and one after
    for state in saved:
        assert torch.equal(_run(pipe, req, resume=state)[0], want), state.step


# random weights move more between steps: only a threshold of 1 skips
@pytest.mark.parametrize(
    "model, steps, every, cache", [("tiny", 6, 1, "fbcache:0.3"), ("tiny-moe-random", 10, 3, "fbcache:1")]
)
def test_a_cached_generation_resumes_exactly(model, steps, every, cache):
    """Each rank's step-cache residuals go into the state: a resumed generation takes the decisions the
    uninterrupted one took (the same counts) and ends with the same latents, the two experts' across
    their switch too."""
    pipe = _pipe(model=model)
    req = GenerationRequest(**REQUEST | {"num_inference_steps": steps, "cache": cache})
    want, saved = _run(pipe, req, every=every)
    counts = (pipe.evaluations.evaluated, pipe.evaluations.skipped)
    assert counts[1] > 0 and all(s.cache is not None for s in saved)
    for state in saved:
        got, _ = _run(pipe, req, resume=state)
        assert torch.equal(got, want), state.step
        assert (pipe.evaluations.evaluated, pipe.evaluations.skipped) == counts, state.step


def _two_ranks(resume_at: int | None):
    pipe = _pipe(ulysses=2)
    req = GenerationRequest(**REQUEST | {"cache": "fbcache:0.3"})
    want, saved = _run(pipe, req)
    if resume_at is None:
        return want
    state = pipe.mesh.broadcast_object(saved[resume_at - 1])  # the leader's: it holds both ranks' residuals
    assert len(state.cache) == 2 and pipe.evaluations.skipped > 0
    return torch.equal(_run(pipe, req, resume=state)[0], want), want


def test_two_ranks_resume_exactly_and_a_file_round_trips(tmp_path):
    for same, _ in run_distributed(2, _two_ranks, 3, timeout=120):
        assert same
    pipe, req = _pipe(), GenerationRequest(**REQUEST)
    want, saved = _run(pipe, req)
    key = {"model": "tiny", "layout": [1, 1, 1], "request": REQUEST}
    expected = Expected(REQUEST["num_inference_steps"], pipe.latent_shape(pipe.validate(req)))
    path = str(tmp_path / "checkpoints" / "job.pt")
    save_file(path, saved[2], key)
    state, why = load_file(path, key, expected)
    assert why is None and torch.equal(_run(pipe, req, resume=state)[0], want)

    assert load_file(path, key | {"layout": [2, 1, 1]}, expected) == (None, "made for another layout")
    assert load_file(str(tmp_path / "none.pt"), key, expected) == (None, None)
    with open(path, "r+b") as f:  # torn mid-write by something other than save_file
        f.truncate(100)
    state, why = load_file(path, key, expected)
    assert state is None and why.startswith("unreadable")
    torch.save({"format": 0, "key": "{}", "state": {}}, path)
    assert load_file(path, key, expected) == (None, "format 0 is not 1")


def test_a_malformed_checkpoint_is_refused_with_the_reason(tmp_path):
    """A file that loads, of the right format and key, holding what a resume cannot use."""
    path, key = str(tmp_path / "job.pt"), {"model": "tiny"}
    good = DenoiseState(step=3, latents=torch.zeros(1, 4, 2, 4, 4), scheduler={"order": 2, "steps": [1.0]},
                        generator=torch.Generator().get_state())  # fmt: skip
    expected = Expected(steps=6, latents=(1, 4, 2, 4, 4))
    save_file(path, good, key)
    assert load_file(path, key, expected)[1] is None
    cache = {"first": None, "rest": {"cond": torch.zeros(2)}}
    for change, why in [
        (dict(latents=torch.zeros(1, 4, 3, 4, 4)), "the latents are not float32 of shape (1, 4, 2, 4, 4)"),
        (dict(latents=torch.zeros(1, 4, 2, 4, 4, dtype=torch.float64)), "the latents are not float32"),
        (dict(step=6), "step 6 is not 1 to 5"),
        (dict(step=True), "step True is not 1 to 5"),
        (dict(generator=torch.zeros(3)), "the generator state is not a CPU generator's"),
        (dict(scheduler=[1]), "the scheduler state is not a table of plain values"),
        (dict(skipped=-1), "the evaluation counts are not counts"),
        (dict(sampler=1), "the sampler is not a string"),
        (dict(cache=[cache, cache]), "the step cache does not hold one state for each of the 1 ranks"),
        (dict(cache=[cache | {"rest": {}}]), "holds no residuals"),
        (dict(cache=[cache | {"first": 1}]), "a step-cache residual is not a floating-point tensor"),
    ]:  # fmt: skip
        save_file(path, replace(good, **change), key)
        state, said = load_file(path, key, expected)
        assert state is None and said.startswith("malformed (") and why in said, (change, said)
    for data, why in [
        ({"format": 1, "state": {}}, "malformed (no readable key)"),
        ({"format": 1, "key": "[1]", "state": {}}, "malformed (no readable key)"),
        ({"format": 1, "key": json.dumps(key), "state": {"step": 1}}, "malformed (the state must hold"),
    ]:
        torch.save(data, path)
        assert load_file(path, key, expected)[1].startswith(why), data


def test_auto_saves_whenever_the_steps_took_a_hundred_times_the_cost():
    pipe, req = _pipe(), GenerationRequest(**REQUEST)
    # a save costing an hour: never; costing its capture only, allowed the whole time (share 1): every step
    for write_s, share, want in ((3600.0, 0.01, []), (0.0, 1.0, [1, 2, 3, 4, 5])):
        saved: list[DenoiseState] = []
        auto = Checkpointing(0, saved.append, share=share, write_cost=lambda w=write_s: w)
        pipe.denoise(req, checkpoints=auto)
        assert [s.step for s in saved] == want, write_s


def test_a_checkpoint_that_cannot_be_written_leaves_the_last_one_and_no_partial(tmp_path, monkeypatch):
    """A full disk mid-write (torch.save's ENOSPC): the previous checkpoint stays, and the partial file goes
    rather than fill the disk further (it kept a job's server from recovering once space was freed)."""
    path, key = str(tmp_path / "job.pt"), {"model": "tiny"}
    state = DenoiseState(step=1, latents=torch.zeros(1, 4, 2, 4, 4), scheduler={}, generator=None)
    save_file(path, state, key)
    before = open(path, "rb").read()

    def full(obj, name):
        open(name, "wb").write(b"half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(OSError, match="No space"):
        save_file(path, replace(state, step=2), key)
    assert open(path, "rb").read() == before and [p.name for p in tmp_path.iterdir()] == ["job.pt"]
