"""LoRA merged into the weights at load (dit/lora.py) against diffusers' `load_lora_adapter` + `fuse_lora`
on `WanTransformer3DModel`, in the three key layouts users have; strength, stacking, full differences, errors,
and the `--lora` / `ITHACA_LORA` settings."""

from __future__ import annotations

import argparse

import pytest
import torch
from diffusers.loaders import WanLoraLoaderMixin
from safetensors.torch import save_file

from dit import load_transformer
from dit.lora import parse_spec, parse_specs
from tests.test_wan_model import TINY, inputs, reference, rel_err

RANK = 4
# original Wan module → diffusers module, written out here apart from dit/wan/state_dict.py's table
BLOCK = {"self_attn.q": "attn1.to_q", "self_attn.k": "attn1.to_k", "self_attn.v": "attn1.to_v",
         "self_attn.o": "attn1.to_out.0", "cross_attn.q": "attn2.to_q", "cross_attn.k": "attn2.to_k",
         "cross_attn.v": "attn2.to_v", "cross_attn.o": "attn2.to_out.0", "ffn.0": "ffn.net.0.proj",
         "ffn.2": "ffn.net.2"}  # fmt: skip
BLOCKS = {f"blocks.{i}.{o}": f"blocks.{i}.{d}" for i in range(TINY["num_layers"]) for o, d in BLOCK.items()}
OUTER = {"head.head": "proj_out", "text_embedding.0": "condition_embedder.text_embedder.linear_1",
         "time_embedding.2": "condition_embedder.time_embedder.linear_2"}  # fmt: skip
NAMES = {**BLOCKS, **OUTER}


def random_lora(ref, modules, seed: int, alpha: bool) -> dict:
    """{original module: (A, B, alpha or None)}, shaped after the diffusers model's weights; alphas 1-3 make
    alpha / rank differ from 1 and from module to module."""
    g = torch.Generator().manual_seed(seed)
    lora = {}
    for k, name in enumerate(modules):
        out, fan_in = ref.get_submodule(NAMES[name]).weight.shape
        down = torch.randn(RANK, fan_in, generator=g) / fan_in**0.5
        up = torch.randn(out, RANK, generator=g) / RANK**0.5
        lora[name] = (down, up, float(k % 3 + 1) if alpha else None)
    return lora


def write(path, lora: dict, layout: str, extra: dict | None = None):
    state = dict(extra or {})
    for name, (down, up, alpha) in lora.items():
        module = {"peft": f"transformer.{NAMES[name]}", "kohya": "lora_unet_" + name.replace(".", "_"),
                  "original": f"diffusion_model.{name}"}[layout]  # fmt: skip
        a, b = ("lora_A", "lora_B") if layout == "peft" else ("lora_down", "lora_up")
        state[f"{module}.{a}.weight"], state[f"{module}.{b}.weight"] = down, up
        if alpha is not None:
            state[f"{module}.alpha"] = torch.tensor(alpha)
    save_file(state, path)
    return path


def fused_by_diffusers(ref, path, strength: float):
    """diffusers' own path: its Wan loader converts the kohya and original-Wan layouts, PEFT merges."""
    state = WanLoraLoaderMixin.lora_state_dict(str(path))
    alphas = {k: v.item() for k, v in state.items() if k.endswith(".alpha")}  # PEFT layout: passed apart
    state = {k: v for k, v in state.items() if not k.endswith(".alpha")}
    ref.load_lora_adapter(state, prefix="transformer", adapter_name="test", network_alphas=alphas or None)
    ref.fuse_lora(lora_scale=strength)
    return ref


def forward(model, diffusers=False):
    x, t, ctx = inputs(TINY, 2, 4, 6)
    with torch.no_grad():
        return model(x, t, ctx, return_dict=False)[0] if diffusers else model(x, t, ctx)


@pytest.mark.parametrize("layout", ["peft", "kohya", "original"])
def test_merge_matches_diffusers_fuse(tmp_path, layout):
    ref = reference(tmp_path / "model")
    if layout == "kohya":  # musubi-tuner's layout: every block module, each with its alpha
        lora, extra = random_lora(ref, BLOCKS, 1, alpha=True), {}
    else:  # diffusers converts the original layout's alphas on block modules only
        lora = {
            **random_lora(ref, BLOCKS, 1, alpha=True),
            **random_lora(ref, OUTER, 2, alpha=layout == "peft"),
        }
        g = torch.Generator().manual_seed(3)
        biased = ("blocks.0.self_attn.q", "blocks.1.ffn.0", "head.head") if layout == "original" else ()
        extra = {
            f"diffusion_model.{m}.diff_b": torch.randn(ref.get_submodule(NAMES[m]).bias.shape, generator=g)
            for m in biased
        }
    path = write(tmp_path / "lora.safetensors", lora, layout, extra)

    ours = load_transformer(tmp_path / "model", loras=[(path, 0.7)])
    plain = forward(load_transformer(tmp_path / "model"))
    want = forward(fused_by_diffusers(ref, path, 0.7), diffusers=True)
    assert rel_err(forward(ours), want) <= 1e-5
    assert rel_err(plain, want) > 0.05  # the LoRA changes the output


@pytest.mark.parametrize("prefix", ["", "diffusion_model.", "base_model.model."])
def test_peft_prefixes_name_the_same_weights(tmp_path, prefix):
    ref = reference(tmp_path / "model")
    lora = random_lora(ref, NAMES, 1, alpha=True)
    path = write(tmp_path / "lora.safetensors", lora, "peft")
    state = WanLoraLoaderMixin.lora_state_dict(str(path))
    save_file(
        {prefix + k.removeprefix("transformer."): v for k, v in state.items()}, tmp_path / "other.safetensors"
    )
    want = load_transformer(tmp_path / "model", loras=[(path, 1.0)]).state_dict()
    got = load_transformer(tmp_path / "model", loras=[(tmp_path / "other.safetensors", 1.0)]).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strength_zero_is_no_lora(tmp_path, dtype):
    ref = reference(tmp_path / "model")
    path = write(tmp_path / "lora.safetensors", random_lora(ref, NAMES, 1, alpha=True), "original")
    want = load_transformer(tmp_path / "model", dtype=dtype).state_dict()
    got = load_transformer(tmp_path / "model", dtype=dtype, loras=[(path, 0.0)]).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_loras_add(tmp_path):
    ref = reference(tmp_path / "model")
    a = write(tmp_path / "a.safetensors", random_lora(ref, NAMES, 1, alpha=True), "peft")
    b = write(tmp_path / "b.safetensors", random_lora(ref, BLOCKS, 2, alpha=True), "kohya")
    base = load_transformer(tmp_path / "model").state_dict()
    only_a = load_transformer(tmp_path / "model", loras=[(a, 0.5)]).state_dict()
    only_b = load_transformer(tmp_path / "model", loras=[(b, -1.5)]).state_dict()
    both = load_transformer(tmp_path / "model", loras=[(a, 0.5), (b, -1.5)]).state_dict()
    for k in base:
        torch.testing.assert_close(
            both[k] - base[k], (only_a[k] - base[k]) + (only_b[k] - base[k]), atol=1e-6, rtol=0
        )


def test_full_differences_add_to_weight_bias_and_modulation(tmp_path):
    reference(tmp_path / "model")
    base = load_transformer(tmp_path / "model").state_dict()
    g = torch.Generator().manual_seed(4)
    dim = TINY["num_attention_heads"] * TINY["attention_head_dim"]
    diffs = {  # LightX2V key → (our parameter, slice of it along dim 0)
        "blocks.0.self_attn.k.diff": ("blocks.0.self_attn.qkv.weight", slice(dim, 2 * dim)),
        "blocks.0.self_attn.k.diff_b": ("blocks.0.self_attn.qkv.bias", slice(dim, 2 * dim)),
        "blocks.0.norm3.diff": ("blocks.0.norm_cross.weight", slice(None)),
        "blocks.0.diff_m": ("blocks.0.modulation", slice(None)),  # Wan2.2 LightX2V's name
        "blocks.1.modulation.diff": ("blocks.1.modulation", slice(None)),  # ComfyUI's rename of it
    }
    state = {
        f"diffusion_model.{k}": torch.randn(base[p][s].shape, generator=g) for k, (p, s) in diffs.items()
    }
    save_file(state, tmp_path / "diff.safetensors")
    got = load_transformer(tmp_path / "model", loras=[(tmp_path / "diff.safetensors", 2.0)]).state_dict()
    changed = {p for p, _ in diffs.values()}
    for key, (p, s) in diffs.items():
        torch.testing.assert_close(got[p][s], base[p][s] + 2.0 * state[f"diffusion_model.{key}"])
    assert all(torch.equal(got[k], base[k]) for k in base if k not in changed)


def test_keys_that_fit_no_weight_are_listed(tmp_path):
    ref = reference(tmp_path / "model")
    good = random_lora(ref, {"blocks.0.self_attn.q": None}, 1, alpha=False)
    bad = {
        "diffusion_model.blocks.7.self_attn.q.lora_down.weight": torch.zeros(RANK, 24),  # no block 7
        "diffusion_model.blocks.7.self_attn.q.lora_up.weight": torch.zeros(24, RANK),
        "lora_unet_blocks_0_self_attn_x.lora_down.weight": torch.zeros(RANK, 24),
        "transformer.blocks.0.attn1.to_q.lora_magnitude_vector": torch.zeros(24),  # DoRA: not a LoRA
    }
    path = write(tmp_path / "bad.safetensors", good, "original", bad)
    with pytest.raises(ValueError, match="4 key\\(s\\) name no weight of the model") as e:
        load_transformer(tmp_path / "model", loras=[(path, 1.0)])
    assert all(key in str(e.value) for key in bad) and "blocks.0.self_attn.q.lora_down" not in str(e.value)

    wrong = {"diffusion_model.blocks.0.ffn.0.lora_down.weight": torch.zeros(RANK, 24),
             "diffusion_model.blocks.0.ffn.0.lora_up.weight": torch.zeros(24, RANK),  # ffn.0 has 48 outputs
             "diffusion_model.blocks.0.ffn.2.lora_down.weight": torch.zeros(RANK, 48),
             "diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(RANK, 12),  # q takes 24
             "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(24, RANK)}  # fmt: skip
    save_file(wrong, tmp_path / "wrong.safetensors")
    with pytest.raises(ValueError) as e:
        load_transformer(tmp_path / "model", loras=[(tmp_path / "wrong.safetensors", 1.0)])
    assert "blocks.0.ffn.0.lora_up.weight: delta (24, 24) does not fit blocks.0.ffn.0.weight (48, 24)" in str(
        e.value
    )
    assert "blocks.0.ffn.2: a LoRA needs both its down (A) and up (B) matrix" in str(e.value)
    # q's share of the fused q/k/v weight, said to be one (it read as the whole weight of q's shape)
    assert ("self_attn.q.lora_up.weight: delta (24, 12) does not fit blocks.0.self_attn.qkv.weight (24, 24), "
            "part 1 of 3 of the fused (72, 24)") in str(e.value)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_transformer(tmp_path / "model", loras=[(tmp_path / "missing.safetensors", 1.0)])
    with pytest.raises(FileNotFoundError, match="a folder, not a LoRA file"):  # it said "no such file"
        load_transformer(tmp_path / "model", loras=[(tmp_path, 1.0)])
    save_file({}, tmp_path / "empty.safetensors")  # merged as nothing, silently
    with pytest.raises(ValueError, match="empty.safetensors: it holds no tensors"):
        load_transformer(tmp_path / "model", loras=[(tmp_path / "empty.safetensors", 1.0)])


def test_spec_parsing():
    assert parse_spec("lora.safetensors") == ("lora.safetensors", 1.0)
    assert parse_spec("/m/lora.safetensors:0.75") == ("/m/lora.safetensors", 0.75)
    assert parse_spec("C:/loras/a:b.safetensors:-1e-1") == ("C:/loras/a:b.safetensors", -0.1)  # last ':' only
    assert parse_spec("/m/a:b.safetensors") == ("/m/a:b.safetensors", 1.0)  # what follows is no number
    assert parse_specs(" a.safetensors:2 ; b:c.safetensors,, c.safetensors ") == (
        ("a.safetensors", 2.0), ("b:c.safetensors", 1.0), ("c.safetensors", 1.0))  # fmt: skip
    for bad, says in ((":0.5", "no file path"), ("a.safetensors:nan", "finite"), ("x:inf", "finite")):
        with pytest.raises(ValueError, match=says):
            parse_spec(bad)


def test_cli_lora_flag(tmp_path, capsys):
    from dit.cli import add_subcommands
    from dit.cli_args import pipeline_argv, pipeline_config

    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="command"))
    a, b = tmp_path / "a:1.safetensors", tmp_path / "b.safetensors"
    a.touch(), b.touch()
    for command in (["generate", "a fox"], ["parity"]):
        args = parser.parse_args([*command, "--lora", f"{a}:0.5", "--lora", str(b)])
        assert pipeline_config(args).loras == ((str(a), 0.5), (str(b), 1.0))
    argv = pipeline_argv(args)  # parity's runs get the same LoRAs
    assert [argv[i + 1] for i, x in enumerate(argv) if x == "--lora"] == [f"{a}:0.5", f"{b}:1.0"]
    assert pipeline_config(parser.parse_args(["generate", "a fox"])).loras == ()
    for spec, says in ((f"{tmp_path}/missing.safetensors:2", "missing.safetensors: no such file"),
                       (f"{b}:nan", "the strength must be a finite number"),
                       # the file is there: "no such file" blamed it
                       (f"{b}:abc", f"no such file; {b} is one, but 'abc' after its ':' is no")):  # fmt: skip
        with pytest.raises(SystemExit):
            parser.parse_args(["generate", "a fox", "--lora", spec])
        assert says in capsys.readouterr().err


def test_ithaca_lora_setting(capsys):
    from server.config import add_arguments, from_args

    def parse(argv, env, worker_only=False):
        parser = argparse.ArgumentParser()
        add_arguments(parser, worker_only=worker_only)
        return from_args(parser.parse_args(argv), environ=env)

    config = parse([], {"ITHACA_LORA": "/m/a:b.safetensors:0.5; /m/c.safetensors"})
    assert config.loras == (("/m/a:b.safetensors", 0.5), ("/m/c.safetensors", 1.0))
    assert parse(config.worker_argv(), {}, worker_only=True).loras == config.loras  # what the workers get
    assert parse([], {}).loras == parse([], {"ITHACA_LORA": ""}).loras == ()
    with pytest.raises(ValueError, match="^ITHACA_LORA: LoRA 'x:inf': the strength must be a finite number$"):
        parse([], {"ITHACA_LORA": "a.safetensors, x:inf"})
    with pytest.raises(SystemExit):
        parse(["--lora", ":1"], {})
    assert "argument --lora: LoRA ':1': no file path" in capsys.readouterr().err


def test_pipeline_config_loras_reach_the_model(tmp_path):
    from dit.pipeline import PipelineConfig, load_pipeline

    qkv = load_transformer("tiny-random").state_dict()["blocks.0.self_attn.qkv.weight"]
    dim = qkv.shape[1]
    diff = torch.randn(dim, dim, generator=torch.Generator().manual_seed(5))
    save_file({"diffusion_model.blocks.0.self_attn.v.diff": diff}, tmp_path / "v.safetensors")
    pipe = load_pipeline(
        PipelineConfig(model="tiny-random", device="cpu", loras=((str(tmp_path / "v.safetensors"), 0.5),))
    )
    got = next(p for n, p in pipe.model.named_parameters() if n.endswith("blocks.0.self_attn.qkv.weight"))
    torch.testing.assert_close(got[2 * dim :], qkv[2 * dim :] + 0.5 * diff)
    torch.testing.assert_close(got[: 2 * dim], qkv[: 2 * dim], rtol=0, atol=0)


def test_hunyuan_takes_the_diffusers_layout(tmp_path):
    """Families without a LoRA resolver of their own read LoRA files with their checkpoint's."""
    qkv = load_transformer("tiny-joint").state_dict()["blocks.0.attn.img_qkv.weight"]
    third = qkv.shape[0] // 3
    g = torch.Generator().manual_seed(6)
    down, up = torch.randn(RANK, qkv.shape[1], generator=g), torch.randn(third, RANK, generator=g)
    module = "transformer.transformer_blocks.0.attn.to_k"
    state = {
        f"{module}.lora_A.weight": down,
        f"{module}.lora_B.weight": up,
        f"{module}.alpha": torch.tensor(2.0),
    }
    save_file(state, tmp_path / "k.safetensors")
    got = load_transformer("tiny-joint", loras=[(tmp_path / "k.safetensors", 0.5)]).state_dict()
    got = got["blocks.0.attn.img_qkv.weight"]
    torch.testing.assert_close(got[third : 2 * third], qkv[third : 2 * third] + 0.5 * 2.0 / RANK * up @ down)
    assert torch.equal(got[:third], qkv[:third]) and torch.equal(got[2 * third :], qkv[2 * third :])


def test_a_lora_that_does_not_fit_stops_the_launch_in_one_line(tmp_path, monkeypatch, capsys):
    """`ithaca generate` and `ithaca serve` check the LoRA files against the model before any rank starts
    (headers only): exit 2 and the keys that do not fit, not a traceback from every rank."""
    import dit.cli
    from server.cli import main

    def no_launch(*args, **kwargs):
        raise AssertionError("ranks started")

    monkeypatch.setattr(dit.cli, "run_on_ranks", no_launch)
    monkeypatch.setattr(dit.cli, "load_pipeline", no_launch, raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    path = tmp_path / "other.safetensors"
    save_file({"diffusion_model.blocks.9.self_attn.q.diff": torch.zeros(4)}, path)
    for argv in (["generate", "a fox", "--nproc", "2"], ["serve", "--data-dir", str(tmp_path / "d")]):
        assert main([*argv, "--lora", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"ithaca {argv[0]}: error: --lora: LoRA {path}: 1 key(s) name no weight"), err
        assert "diffusion_model.blocks.9.self_attn.q.diff" in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()  # serve stopped before its store
    junk = tmp_path / "junk.safetensors"  # a damaged file: a traceback from safetensors before
    junk.write_bytes(b"not a safetensors file")
    assert main(["generate", "a fox", "--lora", str(junk)]) == 2
    assert f"--lora: {junk} is not a readable safetensors file (" in capsys.readouterr().err
