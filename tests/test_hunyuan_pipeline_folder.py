"""A diffusers-layout HunyuanVideo-1.5 pipeline folder, saved from tiny random parts with
`HunyuanVideo15Pipeline.save_pretrained` (tiny Qwen2.5-VL text model + a word-level tokenizer with a chat
template, tiny T5 for ByT5 + ByT5's file-free tokenizer, tiny `AutoencoderKLHunyuanVideo15`, scheduler,
guider), loads through `load_pipeline` and gives diffusers' `HunyuanVideo15Pipeline` latents on the same
folder (measured 3.0e-6 relative after 2 CFG steps, fp32, 2-core CPU box, torch 2.13.0 CPU, 2026-11-22)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from dit.hunyuan.text import TEMPLATE_CROP, system_message
from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from tests.test_hunyuan_parity import save_reference

SPECIAL = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "<|fill|>"]
PROMPT_WORDS = "a neon sign that reads OPEN in the rain blurry low quality".split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% if m['role'] == 'system' %}{{ '<|fill|>' * FILL }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]+", text)  # the Whitespace pre-tokenizer's split


def _save_tokenizer(path):
    """Word-level; `<|fill|>` tokens pad the system turn so the reference's fixed crop of 108 template tokens
    ends exactly where the user text starts, as it does with Qwen's tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = dict.fromkeys(SPECIAL + _words(system_message()) + ["system", "user", "assistant"] + PROMPT_WORDS)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    prefix = (
        1 + 1 + len(_words(system_message())) + 1 + 1 + 1
    )  # <|im_start|>system … <|im_end|> <|im_start|>user
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL[2:],
        chat_template=CHAT_TEMPLATE.replace("FILL", str(TEMPLATE_CROP - prefix)),
    )
    fast.save_pretrained(path)
    return len(words)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import (
        AutoTokenizer,
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    from dit.hunyuan.vae import tiny_vae

    root = tmp_path_factory.mktemp("hunyuan-pipeline")
    transformer = save_reference(root / "_transformer", seed=2, in_channels=9, out_channels=4,
                                 text_embed_dim=32, text_embed_2_dim=16, num_attention_heads=4,
                                 task_type="t2v")  # fmt: skip
    vocab = _save_tokenizer(root / "_tokenizer")
    torch.manual_seed(0)
    qwen = Qwen2_5_VLTextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=2, bos_token_id=None,
                                eos_token_id=None,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "mrope_section": [1, 1, 2]})  # fmt: skip
    byt5 = T5Config(vocab_size=384, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
    HunyuanVideo15Pipeline(
        text_encoder=Qwen2_5_VLTextModel(qwen).eval(),
        tokenizer=AutoTokenizer.from_pretrained(root / "_tokenizer"),
        transformer=transformer,
        vae=tiny_vae(4, seed=1),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder_2=T5EncoderModel(byt5).eval(),
        tokenizer_2=ByT5Tokenizer(),
        guider=ClassifierFreeGuidance(guidance_scale=4.5),
    ).save_pretrained(root)
    return root


REQUEST = dict(prompt='a neon sign that reads "OPEN" in the rain', negative_prompt="blurry, low quality",
               num_frames=5, height=32, width=48, num_inference_steps=2, seed=3)  # fmt: skip


def test_folder_loads_with_the_family_parts(folder):
    from diffusers import AutoencoderKLHunyuanVideo15

    pipe = load_pipeline(PipelineConfig(model=str(folder), device="cpu"))
    assert (pipe.sampler, pipe.flow_shift, pipe.limits.default_guidance) == ("euler", 7.0, 4.5)
    assert isinstance(pipe.vae, AutoencoderKLHunyuanVideo15) and pipe.limits.size_multiple == 16
    lim = pipe.limits
    assert (lim.default_frames, lim.default_height, lim.default_width, lim.max_prompt_tokens) == (
        121,
        480,
        848,
        1000,
    )
    text = pipe.text_encoder.condition(REQUEST["prompt"])
    words = len(_words(REQUEST["prompt"]))
    # after the crop: the prompt's words, <|im_end|>, <|im_start|> assistant
    assert text["encoder_attention_mask"].sum() == words + 3 == pipe.tokenizer.count_tokens(REQUEST["prompt"])
    assert text["encoder_hidden_states"].shape == (1, 1000, 32)
    assert text["encoder_attention_mask_2"].sum() == len('Text "OPEN". ') + 1  # ByT5 bytes + </s>

    frames = pipe.generate(GenerationRequest(**{**REQUEST, "guidance_scale": 4.5}))
    assert frames.shape == (5, 32, 48, 3) and frames.dtype == np.uint8


def test_latents_match_diffusers_pipeline(folder):
    from diffusers import HunyuanVideo15Pipeline

    ours = load_pipeline(PipelineConfig(model=str(folder), device="cpu"))
    got = ours.denoise(GenerationRequest(**{**REQUEST, "guidance_scale": 4.5}))
    ref_pipe = HunyuanVideo15Pipeline.from_pretrained(folder)
    ref_pipe.set_progress_bar_config(disable=True)
    kw = {k: REQUEST[k] for k in ("prompt", "negative_prompt", "num_frames", "height", "width")}
    generator = torch.Generator("cpu").manual_seed(REQUEST["seed"])
    ref = ref_pipe(**kw, num_inference_steps=2, generator=generator, output_type="latent").frames
    rel = ((got - ref).abs().max() / ref.abs().max()).item()
    print(f"latents vs diffusers: max rel {rel:.2e}")
    assert rel <= 1e-5, rel
