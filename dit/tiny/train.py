"""Trains the tiny default model on rendered clips of its visual language and writes it as a diffusers Wan
pipeline folder (what the `tiny` preset loads): `tokenizer/` (word level), `text_encoder/` (a small UMT5,
random from the seed and frozen: the DiT learns to read it), `vae/` (`dit.wan.vae`: its decoder
trained to render the written-down latents of `dit.tiny.latents`, its encoder to produce them),
`transformer/` (`WanTransformer3DModel` on those latents, flow matching as in Wan, 10 % caption dropout for
guidance), `scheduler/` (Wan's UniPC flow config), `model_index.json` and `ithaca.json` (its request
defaults and limits, `dit.model_card`).

Deterministic from `--seed`: every batch, every noise draw and every rendered clip comes from a generator
seeded by (seed, phase, step), so a run resumed from its checkpoint (`--work`, every `--save-every` steps)
ends with the same weights as one that never stopped. The two phases share nothing but the clips' latents,
so they can run as two processes (`--phases vae`, `--phases dit`); on 2 CPU cores, one process each with
OMP_NUM_THREADS=1, the DiT takes about 30 minutes and the VAE twice that, or about an hour in all when the
VAE is stopped after the DiT ends and resumed with OMP_NUM_THREADS=2.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from dit.model_card import write_card
from dit.preview import write_preview
from dit.tiny.clips import MODEL_DIR, TrainConfig, clip, seeded, stable_seed
from dit.tiny.language import Scene, caption, declared_vocabulary, vocabulary
from dit.tiny.latents import describe
from dit.vocabulary import FILE as VOCABULARY_FILE
from dit.wan.vae import WanVAE, save_vae, tiny_config

# The request defaults the folder's card gives (beside those of what it was trained on: 17 frames of 64×64):
# the step count and guidance measured best by bench/quality.py.
DEFAULT_STEPS, DEFAULT_GUIDANCE = 12, 3.0


def make_tokenizer(cfg: TrainConfig):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<pad>", "</s>", "<unk>", *vocabulary()]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=cfg.max_tokens,
    )


def make_text_encoder(cfg: TrainConfig, vocab: int):
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(
        vocab_size=vocab,
        d_model=cfg.text_dim,
        d_kv=16,
        d_ff=2 * cfg.text_dim,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return UMT5EncoderModel(config).eval().requires_grad_(False)


def make_vae(cfg: TrainConfig):
    """The tiny VAE's layout `cfg.vae_base_dim` wide, random (the weights diffusers' class drew before)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 1)
        return WanVAE(replace(tiny_config(16), base_dim=cfg.vae_base_dim))


def make_dit(cfg: TrainConfig):
    from diffusers import WanTransformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed + 2)
        return WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=cfg.heads,
            attention_head_dim=cfg.head_dim,
            in_channels=16,
            out_channels=16,
            text_dim=cfg.text_dim,
            freq_dim=64,
            ffn_dim=cfg.ffn_dim,
            num_layers=cfg.layers,
            cross_attn_norm=True,
            eps=1e-6,
        )


class OtherRun(ValueError):
    """The work folder holds another run's checkpoints: resumed, they would mix two runs in one model."""


class Checkpoints:
    """One file per phase in `work`, rewritten atomically every `every` steps; `load` resumes a phase. The
    folder names its run (`run.json`: the TrainConfig), and a run of another config refuses it (OtherRun)."""

    def __init__(self, work: Path, every: int, run: dict):
        self.work, self.every = work, every
        work.mkdir(parents=True, exist_ok=True)
        run = json.loads(json.dumps(run))  # as the file reads back (tuples as lists)
        named = work / "run.json"
        if named.exists():
            theirs = json.loads(named.read_text())
            differ = [
                f"{k} {theirs.get(k)!r} there, {v!r} here" for k, v in run.items() if theirs.get(k) != v
            ]
            if differ:
                raise OtherRun(f"{work} holds the checkpoints of another run ({'; '.join(differ)}): give "
                               "another --work, or remove that folder to start over")  # fmt: skip
        elif any(work.glob("*.pt")):
            raise OtherRun(f"{work} holds checkpoints of an unnamed run: give another --work, or remove it")
        else:
            tmp = named.with_suffix(".tmp")
            tmp.write_text(json.dumps(run, indent=1))
            tmp.replace(named)

    def path(self, phase: str) -> Path:
        return self.work / f"{phase}.pt"

    def load(self, phase: str) -> dict | None:
        return torch.load(self.path(phase), weights_only=False) if self.path(phase).exists() else None

    def save(self, phase: str, state: dict) -> None:
        tmp = self.path(phase).with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self.path(phase))


def _lr(step: int, steps: int, peak: float, warmup: int = 100) -> float:
    """Linear warm-up, then cosine down to a tenth."""
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(steps - warmup, 1)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def _run(phase: str, steps: int, ckpt: Checkpoints, modules: dict, step_fn, lr_peak: float) -> None:
    """The training loop both phases share: resume, step, checkpoint, progress bar."""
    params = [p for m in modules.values() for p in m.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr_peak, weight_decay=0.0, betas=(0.9, 0.99))
    start = 0
    state = ckpt.load(phase)
    if state is not None:
        for name, m in modules.items():
            m.load_state_dict(state[name])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    bar = tqdm(range(start, steps), initial=start, total=steps, desc=phase, unit="step", smoothing=0.05)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, lr_peak)
        loss = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if "ema" in modules:
            modules["ema"].update(modules["model"])
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % ckpt.every == 0 or step + 1 == steps:
            ckpt.save(
                phase,
                {
                    **{n: m.state_dict() for n, m in modules.items()},
                    "opt": opt.state_dict(),
                    "step": step + 1,
                },
            )


class EMA(torch.nn.Module):
    """An exponential moving average of a model's weights (what is shipped: steadier than the last step).
    It starts from the initial weights, so `copy_to` takes their share out (as Adam corrects its moments):
    after 3000 steps at 0.999 they would still be 5 % of it, after 800, 45 %."""

    def __init__(self, model: torch.nn.Module, decay: float):
        super().__init__()
        self.decay = decay
        self.shadow = torch.nn.ParameterList(
            [torch.nn.Parameter(p.detach().clone(), requires_grad=False) for p in model.parameters()]
        )

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        for s, p in zip(self.shadow, model.parameters(), strict=True):
            s.lerp_(p.detach(), 1 - self.decay)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module, init: torch.nn.Module, steps: int) -> None:
        """`model` ← the average of the `steps` trained weights, with `init` (their start) taken out."""
        left = self.decay**steps
        for s, p, p0 in zip(self.shadow, model.parameters(), init.parameters(), strict=True):
            p.copy_((s - left * p0) / (1 - left))


def train_vae(cfg: TrainConfig, ckpt: Checkpoints):
    """The decoder learns to render `describe`'s latents (with a little noise, so it forgives the DiT's
    small errors), then the encoder learns to produce them: two regressions."""
    vae = make_vae(cfg).train()

    def batch(phase: int, i: int) -> torch.Tensor:
        first = 10_000_000 * phase + i * cfg.vae_batch
        return torch.stack([clip(cfg, first + k, cfg.vae_frames)[1] for k in range(cfg.vae_batch)])

    def decoder_step(i: int) -> torch.Tensor:
        x = batch(1, i)
        z = describe(x)
        y = vae.decode(z + 0.05 * torch.randn(z.shape, generator=seeded(cfg, 2, i)))
        # the object covers a few % of the frame: weigh its pixels up, or the black background wins
        weight = 1 + 9 * (x > -0.9).any(1, keepdim=True).float()
        return (weight * ((y - x).abs() + (y - x) ** 2)).mean()

    def encoder_step(i: int) -> torch.Tensor:
        x = batch(2, i)
        return (vae.encode(x) - describe(x)).pow(2).mean()

    _run("vae-decoder", cfg.vae_steps, ckpt, {"model": vae}, decoder_step, cfg.vae_lr)
    _run("vae-encoder", cfg.encoder_steps, ckpt, {"model": vae}, encoder_step, cfg.vae_lr)
    return vae.eval().requires_grad_(False)


def dit_clips(cfg: TrainConfig, ckpt: Checkpoints) -> tuple[torch.Tensor, list[Scene]]:
    """The DiT's training set: `cfg.clips` clips as latents (`describe`: exactly what the decoder renders),
    cached in `work`."""
    cached = ckpt.load("latents")
    if cached is not None:
        return cached["latents"], cached["scenes"]
    batch = [clip(cfg, i, cfg.frames) for i in tqdm(range(cfg.clips), desc="render", unit="clip")]
    scenes, latents = [s for s, _ in batch], describe(torch.stack([x for _, x in batch]))
    ckpt.save("latents", {"latents": latents, "scenes": scenes})
    return latents, scenes


def train_dit(cfg: TrainConfig, latents: torch.Tensor, scenes: list[Scene], tokenizer, text_encoder, ckpt):
    dit = make_dit(cfg).train()
    ema = EMA(dit, cfg.ema)

    @torch.no_grad()
    def text(captions: list[str]) -> torch.Tensor:
        """Wan's layout: the encoder's states for the real tokens, zeros up to max_tokens."""
        t = tokenizer(
            captions, padding="max_length", max_length=cfg.max_tokens, truncation=True, return_tensors="pt"
        )
        states = text_encoder(t.input_ids, t.attention_mask).last_hidden_state
        return states * t.attention_mask[..., None]

    def step(i: int) -> torch.Tensor:
        g = seeded(cfg, 3, i)
        rng = random.Random(stable_seed(cfg.seed, "dit", i))
        idx = torch.randint(len(scenes), (cfg.dit_batch,), generator=g)
        x0 = latents[idx]
        captions = [
            "" if rng.random() < cfg.caption_dropout else caption(scenes[j], rng) for j in idx.tolist()
        ]
        u = torch.rand(cfg.dit_batch, generator=g)
        sigma = cfg.shift * u / (1 + (cfg.shift - 1) * u)
        noise = torch.randn(x0.shape, generator=g)
        s = sigma.view(-1, 1, 1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        v = dit(xt, sigma * 1000, text(captions), return_dict=False)[0]
        return ((v - (noise - x0)) ** 2).mean()

    _run("dit", cfg.dit_steps, ckpt, {"model": dit, "ema": ema}, step, cfg.dit_lr)
    ema.copy_to(dit, make_dit(cfg), cfg.dit_steps)
    return dit.eval().requires_grad_(False)


def write_folder(out: Path, cfg: TrainConfig, tokenizer, text_encoder, vae, dit, mean, std) -> None:
    """The diffusers Wan pipeline layout (float32 safetensors), replacing `out` whole."""
    from diffusers import UniPCMultistepScheduler

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp / "tokenizer")
    text_encoder.save_pretrained(tmp / "text_encoder")
    vae.config.latents_mean, vae.config.latents_std = mean.tolist(), std.tolist()
    save_vae(vae, tmp / "vae")
    dit.save_pretrained(tmp / "transformer")
    UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        num_train_timesteps=1000,
        flow_shift=cfg.shift,
    ).save_pretrained(tmp / "scheduler")
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": "0.36.0",
        "tokenizer": ["transformers", "PreTrainedTokenizerFast"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
    }
    (tmp / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    (tmp / "training.json").write_text(json.dumps(asdict(cfg), indent=2) + "\n")
    write_card(tmp, card_limits(cfg))
    (tmp / VOCABULARY_FILE).write_text(json.dumps(declared_vocabulary(), indent=2) + "\n")
    from dit.tiny import preview_map  # it renders clips as this module does

    write_preview(tmp / "vae", preview_map.fit(vae, cfg))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)


def card_limits(cfg: TrainConfig):
    """The tiny presets' freedom (seconds on a CPU), its defaults the trained model's."""
    from dit.families import TINY_LIMITS

    return replace(TINY_LIMITS, default_frames=cfg.frames, default_height=cfg.height, default_width=cfg.width,
                   default_steps=DEFAULT_STEPS, default_guidance=DEFAULT_GUIDANCE)  # fmt: skip


PHASES = ("vae", "dit")


def train(
    cfg: TrainConfig, work: Path, out: Path, save_every: int = 100, phases: tuple[str, ...] = PHASES
) -> None:
    """Train `phases` (resuming from `work`) and, when both are done, write the folder. The phases share
    nothing but the work folder (the DiT learns `describe`'s latents, not the VAE's), so two processes may
    run one each, side by side; a last run with both phases finds them finished and writes `out`."""
    torch.manual_seed(cfg.seed)
    ckpt = Checkpoints(work, save_every, asdict(cfg))
    started = time.monotonic()
    tokenizer = make_tokenizer(cfg)
    text_encoder = make_text_encoder(cfg, len(tokenizer))
    vae = train_vae(cfg, ckpt) if "vae" in phases else None
    if "dit" not in phases:
        return
    latents, scenes = dit_clips(cfg, ckpt)
    # normalise as Wan does (latents_mean/std in the VAE config): the DiT sees unit-scale channels
    mean, std = latents.mean((0, 2, 3, 4)), latents.std((0, 2, 3, 4))
    normed = (latents - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1)
    dit = train_dit(cfg, normed, scenes, tokenizer, text_encoder, ckpt)
    if vae is not None:
        write_folder(out, cfg, tokenizer, text_encoder, vae, dit, mean, std)
        print(f"wrote {out} in {(time.monotonic() - started) / 60:.1f} min")


def _positive(kind):
    """An argparse type: a finite number above 0 of `kind`."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a number above 0, not {text!r}")
        return value

    return parse


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--out", type=Path, default=MODEL_DIR, help="the model folder to write (default: the shipped one)"
    )
    p.add_argument(
        "--work", type=Path, default=Path("/tmp/ithaca-tiny-train"), help="checkpoints, for resuming"
    )
    p.add_argument("--seed", type=int, default=TrainConfig.seed)
    p.add_argument("--save-every", type=_positive(int), default=100, help="checkpoint every N steps")
    p.add_argument(
        "--scale", type=_positive(float), default=1.0, help="multiply every step count (a quick trial: 0.05)"
    )
    p.add_argument(
        "--phases",
        nargs="+",
        choices=PHASES,
        default=list(PHASES),
        help="train these only (run side by side)",
    )
    args = p.parse_args(argv)
    base = TrainConfig(seed=args.seed)
    cfg = TrainConfig(
        seed=args.seed,
        vae_steps=max(1, round(base.vae_steps * args.scale)),
        encoder_steps=max(1, round(base.encoder_steps * args.scale)),
        dit_steps=max(1, round(base.dit_steps * args.scale)),
        clips=max(8, round(base.clips * args.scale)),
    )
    try:
        train(cfg, args.work, args.out, args.save_every, tuple(args.phases))
    except OtherRun as e:
        p.error(str(e))
    except KeyboardInterrupt:  # the checkpoints hold every step up to the last --save-every
        sys.exit(f"interrupted; the same command resumes from the last checkpoint in {args.work}")


if __name__ == "__main__":
    main()
