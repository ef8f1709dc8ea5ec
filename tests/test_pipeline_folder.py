"""A diffusers-layout Wan pipeline folder (transformer/, text_encoder/ + tokenizer/, vae/, scheduler/), saved
from tiny random models in tmp_path, loads into the pipeline: UMT5 through transformers, the folder's VAE and
scheduler shift, Wan's limits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline
from dit.presets import PRESETS
from dit.text_encoder import UMT5TextEncoder
from dit.vae import tiny_vae

WORDS = ["<pad>", "</s>", "<unk>", "a", "red", "fox", "in", "snow", "blurry"]


def _save_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from diffusers import WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    root = tmp_path_factory.mktemp("wan-pipeline")
    cfg = {k: v for k, v in PRESETS["tiny"].items() if not k.startswith("_")}
    torch.manual_seed(0)
    WanTransformer3DModel(**cfg).save_pretrained(root / "transformer")
    text = UMT5Config(
        vocab_size=len(WORDS), d_model=cfg["text_dim"], d_kv=8, d_ff=64, num_layers=1, num_heads=4
    )
    UMT5EncoderModel(text).save_pretrained(root / "text_encoder")
    _save_tokenizer(root / "tokenizer")
    tiny_vae(cfg["in_channels"], seed=1).save_pretrained(root / "vae")
    (root / "scheduler").mkdir()
    scheduler = {"_class_name": "UniPCMultistepScheduler", "flow_shift": 5.0, "use_flow_sigmas": True}
    (root / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler))
    return root


def test_pipeline_folder_loads_and_generates(folder):
    pipe = load_pipeline(PipelineConfig(model=str(folder), device="cpu"))
    assert isinstance(pipe.text_encoder, UMT5TextEncoder) and pipe.flow_shift == 5.0
    saved_vae = tiny_vae(
        pipe.model.config.in_channels, seed=1
    )  # the folder's VAE, not the built-in seed-0 one
    assert all(torch.equal(a, b) for a, b in zip(pipe.vae.parameters(), saved_vae.parameters(), strict=True))
    assert (pipe.limits.default_frames, pipe.limits.default_height, pipe.limits.default_width) == (
        81,
        480,
        832,
    )
    assert pipe.limits.max_prompt_tokens == 512

    # Wan's text layout: UMT5's states for the real tokens ("a red fox" + </s>), zeros up to 512.
    emb = pipe.text_encoder.encode("a  red fox")
    ids = torch.tensor([[3, 4, 5, 1]])
    direct = pipe.text_encoder.model(ids, torch.ones_like(ids)).last_hidden_state
    assert emb.shape == (1, 512, 32) and pipe.tokenizer.count_tokens("a red fox") == 4
    torch.testing.assert_close(emb[:, :4], direct, rtol=1e-5, atol=1e-6)
    assert emb[:, 4:].abs().max() == 0

    req = GenerationRequest("a red fox in snow", negative_prompt="blurry", num_frames=5, height=32, width=32,
                            num_inference_steps=2)  # fmt: skip
    frames = pipe.generate(req)
    assert frames.shape == (5, 32, 32, 3) and frames.dtype == np.uint8
