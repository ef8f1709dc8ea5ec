"""Ithaca's UMT5 (dit.wan.umt5) against transformers' UMT5EncoderModel and AutoTokenizer, its references:
the same random weights saved to a folder (one file, or shards with `model.safetensors.index.json`) give the
same last hidden states with padding masks (float32; bfloat16/float16 within transformers' own error), the
same token ids on the shipped tiny folder and a T5-style SentencePiece (Unigram) folder, and loading the
tiny model's tokenizer and encoder imports neither transformers nor diffusers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from dit.presets import SHIPPED
from dit.text_encoder import prompt_clean
from dit.wan.umt5 import UMT5Encoder, UMT5Tokenizer

PROMPTS = ["a red circle moving right", "A BIG  blue box, going left!", "im Schnee — 狐狸 🦊 naïve café"]


@pytest.fixture(scope="module", params=[("gated-gelu", None), ("relu", "20KB")], ids=["gated", "sharded"])
def saved(request, tmp_path_factory):
    """A random transformers UMT5EncoderModel saved to a folder → (folder, the model in float32)."""
    from transformers import UMT5Config, UMT5EncoderModel

    proj, shard = request.param
    config = UMT5Config(
        vocab_size=50, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, dropout_rate=0.0,
        relative_attention_num_buckets=8, relative_attention_max_distance=12, feed_forward_proj=proj,
    )  # fmt: skip
    torch.manual_seed(0)
    model = UMT5EncoderModel(config).eval()
    folder = tmp_path_factory.mktemp("umt5")
    model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    assert (folder / "model.safetensors.index.json").is_file() == bool(shard)
    return folder, model


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Two 24-token rows (longer than max_distance: every bucket kind), the second padded after 9 tokens."""
    ids = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    return ids, mask


@torch.no_grad()
def test_encoder_matches_transformers_in_float32(saved):
    folder, reference = saved
    ids, mask = _inputs()
    ours = UMT5Encoder.from_folder(folder, dtype=torch.float32, device="cpu")
    expected = reference(ids, mask).last_hidden_state
    assert (ours(ids, mask) - expected).abs().max() <= 1e-5
    # the padding changes the real tokens' states, so the mask is applied
    assert (ours(ids, torch.ones_like(mask))[1, :9] - expected[1, :9]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@torch.no_grad()
def test_encoder_in_half_precision_within_transformers_own_error(saved, dtype):
    from transformers import UMT5EncoderModel

    folder, reference = saved
    ids, mask = _inputs()
    ours = UMT5Encoder.from_folder(folder, dtype=dtype, device="cpu")
    theirs = UMT5EncoderModel.from_pretrained(folder, dtype=dtype).eval()
    # transformers keeps the feed-forward output projection in float32 in a float16 model
    wo = lambda m: m.encoder.block[0].layer[1].DenseReluDense.wo.weight.dtype
    assert wo(ours) == wo(theirs) == (torch.float32 if dtype == torch.float16 else dtype)
    got, half = ours(ids, mask), theirs(ids, mask).last_hidden_state
    assert got.dtype == half.dtype == dtype
    own_error = (half.float() - reference(ids, mask).last_hidden_state).abs().max()
    assert (got.float() - half.float()).abs().max() <= own_error


def test_tokenizer_ids_are_autotokenizers_on_the_tiny_folder():
    from transformers import AutoTokenizer

    folder = SHIPPED["tiny"]
    ours, theirs = UMT5Tokenizer(folder), AutoTokenizer.from_pretrained(folder / "tokenizer")
    for text in PROMPTS:
        assert ours.token_ids(text) == theirs(text, add_special_tokens=True).input_ids
    assert ours.token_ids("a red circle") == [3, 17, 8, 1]  # </s> closes the prompt
    assert ours.max_tokens == min(512, theirs.model_max_length) == 16


def test_tokenizer_ids_are_autotokenizers_on_a_sentencepiece_folder(tmp_path):
    """umt5-xxl's kind of tokenizer.json (Unigram, Metaspace, `$A </s>`) under T5Tokenizer, which transformers
    rebuilds from the file's vocabulary; a truncation baked into the file is not applied (as transformers)."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import AutoTokenizer

    pieces = ["<pad>", "</s>", "<unk>", "▁", "▁a", "▁red", "▁fox", "▁in", "▁snow", *"snowé", "▁caf"]
    tok = Tokenizer(models.Unigram([(p, -1.0 - i / 10) for i, p in enumerate(pieces)], unk_id=2))
    spaces = normalizers.Replace(Regex(" {2,}"), "▁")
    tok.normalizer = normalizers.Sequence([normalizers.Strip(left=False), spaces])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok.enable_truncation(max_length=3)
    (tmp_path / "tokenizer").mkdir()
    tok.save(str(tmp_path / "tokenizer" / "tokenizer.json"))
    config = {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "model_max_length": 512, "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<pad>"}  # fmt: skip
    (tmp_path / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config))

    ours, theirs = UMT5Tokenizer(tmp_path), AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    for text in [*PROMPTS, "a red fox in snow", "snow café"]:
        assert ours.prompt_ids(text) == theirs(prompt_clean(text), add_special_tokens=True).input_ids
    assert ours.token_ids("a red fox in snow") == [4, 5, 6, 7, 8, 1] and ours.max_tokens == 512


def test_a_tokenizer_folder_without_tokenizer_json_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer").mkdir()
    with pytest.raises(ValueError, match="tokenizer.json"):
        UMT5Tokenizer(tmp_path)


def test_prompt_clean_is_diffusers():
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean as diffusers_clean

    for text in [" a&amp;amp;b\t\n c\u00a0d\u2003e\x1cf  ", "&lt;red&gt;  fox", *PROMPTS]:
        assert prompt_clean(text) == diffusers_clean(text)


def test_loading_and_encoding_imports_neither_transformers_nor_diffusers():
    code = (
        "import sys, torch\n"
        "from dit.presets import SHIPPED\n"
        "from dit.wan.umt5 import load_text_encoder, load_tokenizer\n"
        "tokenizer = load_tokenizer(SHIPPED['tiny'])\n"
        "encoder = load_text_encoder(SHIPPED['tiny'], tokenizer, dim=0, dtype=torch.float32, device='cpu')\n"
        "assert encoder.encode('a red circle moving right').shape == (1, 16, 64)\n"
        "print(sorted(m for m in ('transformers', 'diffusers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
