"""LoRA per request (dit/lora_catalogue.py, dit/lora_switch.py): a job naming LoRA X gives the latents of a
pipeline loaded with X merged (`PipelineConfig.loras`), bit for bit, and the next job without it the base
pipeline's; on Wan (fp32 and bf16), HunyuanVideo-1.5, a two-expert Wan2.2 and two ranks; the catalogue's
names and the request's checks."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

import dit.lora
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from tests.distributed import run_distributed
from tests.test_pipeline_parallel import EXACT_REL

SMALL = dict(prompt="a red fox", num_frames=5, height=32, width=32, num_inference_steps=2, seed=1)
RANK = 4
# original Wan module → (our parameter, slices of it along dim 0)
WAN = {"self_attn.q": ("self_attn.qkv", 3), "self_attn.v": ("self_attn.qkv", 3),
       "self_attn.o": ("self_attn.out", 1), "cross_attn.k": ("cross_attn.kv", 2), "ffn.0": ("ffn.0", 1),
       "ffn.2": ("ffn.2", 1)}  # fmt: skip


def wan_lora(path, seed: int, blocks=(0, 1)):
    """A rank-4 LoRA in the original Wan layout on several block layers, alphas 1-3, one bias difference."""
    params = dict(dit.load_transformer("tiny-random", device="meta").named_parameters())
    g, state = torch.Generator().manual_seed(seed), {}
    for i in blocks:
        for k, (module, (ours, parts)) in enumerate(WAN.items()):
            out, fan_in = params[f"blocks.{i}.{ours}.weight"].shape
            key = f"diffusion_model.blocks.{i}.{module}"
            state[f"{key}.lora_down.weight"] = torch.randn(RANK, fan_in, generator=g) / fan_in**0.5
            state[f"{key}.lora_up.weight"] = torch.randn(out // parts, RANK, generator=g)
            state[f"{key}.alpha"] = torch.tensor(float(k % 3 + 1))
    state["diffusion_model.blocks.0.ffn.0.diff_b"] = torch.randn(
        params["blocks.0.ffn.0.bias"].shape, generator=g
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(state, path)
    return str(path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    wan_lora(root / "x.safetensors", 1)
    wan_lora(root / "style" / "y.safetensors", 2, blocks=(1,))
    wan_lora(root / "pair" / "high_noise.safetensors", 3)
    wan_lora(root / "pair" / "low_noise.safetensors", 4)
    save_file({"diffusion_model.blocks.9.self_attn.q.diff": torch.zeros(4)}, root / "misfit.safetensors")
    (root / "notes.txt").write_text("not a LoRA")
    return root


def load(model="tiny-random", **config):
    return load_pipeline(
        PipelineConfig(model=model, device="cpu", preview_every=0, **config)
    )  # no preview fit


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_job_gives_the_latents_of_a_pipeline_loaded_with_its_loras(folder, dtype, monkeypatch):
    pipe = load(dtype=dtype, lora_dir=str(folder))
    base = pipe.denoise(GenerationRequest(**SMALL))
    x = pipe.denoise(GenerationRequest(**SMALL, loras=[["x", 0.7]]))
    loaded = load(dtype=dtype, loras=((str(folder / "x.safetensors"), 0.7),))
    assert torch.equal(x, loaded.denoise(GenerationRequest(**SMALL)))
    assert not torch.allclose(x, base, rtol=1e-2, atol=0)  # the LoRA changes the video
    assert torch.equal(pipe.denoise(GenerationRequest(**SMALL)), base)  # the base restored exactly
    # two LoRAs: added in name order, as `--lora style/y.safetensors:-1 --lora x.safetensors:0.5`
    both = pipe.denoise(GenerationRequest(**SMALL, loras=(("x", 0.5), ("style/y", -1.0))))
    loaded = load(
        dtype=dtype, loras=((str(folder / "style/y.safetensors"), -1.0), (str(folder / "x.safetensors"), 0.5))
    )
    assert torch.equal(both, loaded.denoise(GenerationRequest(**SMALL)))

    def no_file(*args, **kwargs):
        raise AssertionError("a file was read")

    monkeypatch.setattr(dit.lora, "read_safetensors", no_file)  # X is cached: its header and tensors
    assert torch.equal(pipe.denoise(GenerationRequest(**SMALL, loras=[["x", 0.7]])), x)
    assert torch.equal(pipe.denoise(GenerationRequest(**SMALL)), base)  # the same job twice: no switch
    assert pipe.lora_switches == 5 and pipe.lora_switch_seconds > 0


def test_under_fp8_a_job_gives_the_latents_of_a_pipeline_loaded_with_its_loras_then_quantised(folder):
    """`--quant fp8 --lora-dir`: the set merged into the unquantised weights, then quantised (the bytes of a
    load with `--lora X --quant fp8`); the base quantised again, the bytes it loaded with."""
    pipe = load(dtype="bfloat16", quant="fp8", lora_dir=str(folder))
    base = pipe.denoise(GenerationRequest(**SMALL))
    assert torch.equal(base, load(dtype="bfloat16", quant="fp8").denoise(GenerationRequest(**SMALL)))
    x = pipe.denoise(GenerationRequest(**SMALL, loras=[["x", 0.7]]))
    loaded = load(dtype="bfloat16", quant="fp8", loras=((str(folder / "x.safetensors"), 0.7),))
    assert torch.equal(x, loaded.denoise(GenerationRequest(**SMALL)))
    assert not torch.allclose(x, base, rtol=1e-2, atol=0)
    y = pipe.denoise(GenerationRequest(**SMALL, loras=[["style/y", -1.0]]))  # X's layers back, then Y's
    loaded = load(dtype="bfloat16", quant="fp8", loras=((str(folder / "style/y.safetensors"), -1.0),))
    assert torch.equal(y, loaded.denoise(GenerationRequest(**SMALL)))
    assert torch.equal(pipe.denoise(GenerationRequest(**SMALL)), base)


@pytest.mark.parametrize("quant", ["none", "fp8"])
def test_hunyuan_takes_a_lora_per_request(tmp_path, quant):
    """tiny-joint, a LoRA in diffusers' layout on the image stream's fused q/k/v and the FFN."""
    params = dict(dit.load_transformer("tiny-joint", device="meta").named_parameters())
    g, state = torch.Generator().manual_seed(6), {}
    for module, ours, parts in (("attn.to_k", "attn.img_qkv", 3), ("ff.net.2", "img_mlp.linear_2", 1)):
        out, fan_in = params[f"blocks.0.{ours}.weight"].shape
        state[f"transformer.transformer_blocks.0.{module}.lora_A.weight"] = torch.randn(
            RANK, fan_in, generator=g
        )
        state[f"transformer.transformer_blocks.0.{module}.lora_B.weight"] = torch.randn(
            out // parts, RANK, generator=g
        )
    save_file(state, tmp_path / "k.safetensors")
    request = SMALL
    pipe = load("tiny-joint", lora_dir=str(tmp_path), quant=quant)
    base = pipe.denoise(GenerationRequest(**request))
    got = pipe.denoise(GenerationRequest(**request, loras=[["k", 0.5]]))
    loaded = load("tiny-joint", loras=((str(tmp_path / "k.safetensors"), 0.5),), quant=quant)
    assert torch.equal(got, loaded.denoise(GenerationRequest(**request)))
    assert not torch.allclose(got, base, rtol=1e-2, atol=0)
    assert torch.equal(pipe.denoise(GenerationRequest(**request)), base)


def test_two_experts_take_a_pair_and_a_plain_file_takes_both(folder):
    pipe = load("tiny-moe-random", lora_dir=str(folder))
    listed = {e["name"]: e for e in pipe.lora_catalogue.entries()}
    assert listed["pair"] == {"name": "pair", "experts": True, "fits": True, "error": None}
    request = dict(SMALL, num_inference_steps=4)  # both experts run
    got = {name: pipe.denoise(GenerationRequest(**request, loras=[[name, 0.8]])) for name in ("pair", "x")}
    for name, files in (("pair", ("pair/high_noise", "pair/low_noise")), ("x", ("x", "x"))):
        manual = load("tiny-moe-random")
        for model, file, resolve in zip(
            (manual.model, manual.model_2),
            files,
            (pipe.lora_catalogue.experts[i][1] for i in (0, 1)),
            strict=True,
        ):
            dit.lora.merge(model, dit.lora.plan(model, [(folder / f"{file}.safetensors", 0.8)], resolve))
        assert torch.equal(got[name], manual.denoise(GenerationRequest(**request))), name


def _switching(folder: str, ulysses: int, cfg: int):
    import parallel

    mesh = parallel.init_parallel(ulysses=ulysses, cfg=cfg)
    pipe = load_pipeline(
        PipelineConfig(model="tiny-random", device="cpu", lora_dir=folder, preview_every=0), mesh
    )
    jobs = [(), (("x", 0.7),), ()]
    return [pipe.denoise(GenerationRequest(**SMALL, loras=loras)) for loras in jobs]


def test_two_ranks_switch_as_one(folder):
    want = _switching(str(folder), 1, 1)
    for layout in ((2, 1), (1, 2)):
        ranks = run_distributed(2, _switching, str(folder), *layout, timeout=120)
        for got in ranks:
            assert torch.equal(got[0], got[2])  # the base restored exactly on every rank
            for g, w in zip(got, want, strict=True):
                assert ((g - w).abs().max() / w.abs().max()).item() <= EXACT_REL, layout


def _one_rank_cannot_read(folder: str):
    """Rank 1 cannot read the set's file (gone since the catalogue was read): each job's latents, or what it
    raised."""
    import torch.distributed as dist

    import parallel
    from dit.pipeline import GenerationFailed

    mesh = parallel.init_parallel(ulysses=2)
    pipe = load_pipeline(
        PipelineConfig(model="tiny-random", device="cpu", lora_dir=folder, preview_every=0), mesh
    )
    real, out = dit.lora.read, []

    def gone(merge):
        raise FileNotFoundError(f"{merge.path} is gone")

    dit.lora.read = gone if dist.get_rank() == 1 else real  # the pool's process lives on: put it back
    try:
        for loras in ((("x", 0.7),), ()):
            try:
                out.append(pipe.denoise(GenerationRequest(**SMALL, loras=loras)))
            except GenerationFailed as failed:
                out.append(str(failed))
    finally:
        dit.lora.read = real

    def unknown(loras):  # gone from rank 1's folder before the job: its catalogue no longer names it
        raise ValueError("loras: no LoRA named 'x' in the catalogue")

    if dist.get_rank() == 1:
        pipe.lora_catalogue.plans = unknown
    try:
        pipe.denoise(GenerationRequest(**SMALL, loras=(("x", 0.7),)))
    except (ValueError, GenerationFailed) as e:  # rank 0 waited in apply_loras' collective until the timeout
        out.append(f"{type(e).__name__}: {e}")
    finally:
        vars(pipe.lora_catalogue).pop("plans", None)
    out.append(pipe.denoise(GenerationRequest(**SMALL)))  # the next job runs
    return out


def test_a_set_one_rank_cannot_apply_fails_the_job_on_every_rank_and_the_next_job_runs(folder):
    want = _switching(str(folder), 1, 1)[0]  # the base
    (failed, after, unknown, then), (failed_too, after_too, unknown_too, then_too) = run_distributed(
        2, _one_rank_cannot_read, str(folder), timeout=120
    )
    assert failed == failed_too and failed.startswith(
        "loras: the set could not be applied: FileNotFoundError"
    )
    assert unknown == unknown_too == "GenerationFailed: rank 1: loras: no LoRA named 'x' in the catalogue"
    for got in (after, after_too, then, then_too):  # in step, and the weights the base's on both ranks
        assert ((got - want).abs().max() / want.abs().max()).item() <= EXACT_REL


def test_the_catalogue_and_the_request_checks(folder, tmp_path):
    pipe = load(lora_dir=str(folder))
    listed = pipe.lora_catalogue.entries()
    assert [e["name"] for e in listed] == ["misfit", "pair", "style/y", "x"]
    assert [e["fits"] for e in listed] == [False, False, True, True]
    assert "blocks.9.self_attn.q.diff" in listed[0]["error"] and "two-expert" in listed[1]["error"]
    json.dumps(listed)

    req = pipe.validate(GenerationRequest(**SMALL, loras=[["x", 1], ["style/y", -0.5]]))
    assert req.loras == (("style/y", -0.5), ("x", 1.0))
    spec = json.loads(
        json.dumps(dataclasses.asdict(req))
    )  # as the server stores a job (and its checkpoint key)
    assert (
        spec["loras"] == [["style/y", -0.5], ["x", 1.0]] and pipe.validate(GenerationRequest(**spec)) == req
    )
    for loras, says in (
        ([["nope", 1.0]], "loras: no LoRA named 'nope'"),
        ([["x", 5.0]], "loras: x's strength must be a number between -4.0 and 4.0, got 5.0"),
        ([["x", float("nan")]], "loras: x's strength"),
        ([["misfit", 1.0]], "loras: misfit.safetensors: 1 key\\(s\\) name no weight of the model"),
        ([["pair", 1.0]], "loras: pair is a pair of expert files"),
        ([["x", 1.0], ["x", 0.5]], "loras: x named more than once"),
        ([["x"]], "loras: each must be a \\[name, strength\\] pair"),
    ):
        with pytest.raises(ValueError, match=f"^{says}"):
            pipe.validate(GenerationRequest(**SMALL, loras=loras))
    with pytest.raises(ValueError, match="^loras: this pipeline has no LoRA catalogue"):
        load().validate(GenerationRequest(**SMALL, loras=[["x", 1.0]]))

    wan_lora(folder / "later.safetensors", 5, blocks=(0,))  # seen without a restart
    (folder / "sub").mkdir()
    (folder / "sub" / "broken.safetensors").write_text("not a safetensors file")
    listed = {e["name"]: e for e in pipe.lora_catalogue.entries()}
    assert "later" in listed and listed["sub/broken"]["error"].startswith("sub/broken.safetensors: ")
    assert str(folder) not in listed["sub/broken"]["error"]  # a client sees no path of the server's
    shutil.rmtree(folder / "sub")
    with pytest.raises(ValueError, match="no such folder"):
        load(lora_dir=str(tmp_path / "missing"))


def test_lora_dir_settings_reach_serve(tmp_path, capsys):
    import argparse

    from server.cli import main
    from server.config import add_arguments, from_args

    def parse(argv, env, worker_only=False):
        parser = argparse.ArgumentParser()
        add_arguments(parser, worker_only=worker_only)
        return from_args(parser.parse_args(argv), environ=env)

    config = parse(["--lora-cache", "2"], {"ITHACA_LORA_DIR": "/m/loras"})
    assert (config.lora_dir, config.lora_cache) == ("/m/loras", 2)
    worker = parse(config.worker_argv(), {}, worker_only=True)  # what the ranks get
    assert (worker.lora_dir, worker.lora_cache) == ("/m/loras", 2)
    assert parse([], {}).lora_cache == 4
    # checked before any rank starts: one line, exit 2
    assert main(["serve", "--data-dir", str(tmp_path / "d"), "--lora-dir", str(tmp_path / "none")]) == 2
    assert f"--lora-dir {tmp_path / 'none'}: no such folder" in capsys.readouterr().err


def test_the_bench_runs_at_its_tiniest(capsys):
    from bench import lora_switch

    lora_switch.main(["--dtype", "bfloat16", "--iters", "1", "--round-trips", "1", "--json"])
    rows = {r["row"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert all(r["seconds"] > 0 for r in rows.values() if "seconds" in r)
    subtracted, ours = rows["subtract to unmerge, 1 round trip(s)"], rows["this switch, 1 round trip(s)"]
    assert subtracted["changed"] > 0 and subtracted["latents_rel"] > 0  # bf16 rounding leaves the base behind
    assert ours["changed"] == ours["weights_rel"] == ours["latents_rel"] == 0
