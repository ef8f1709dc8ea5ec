"""Text-to-video: encode the prompt → seeded noise → denoise with the (sequence-parallel) DiT → VAE decode.

Every rank of a replica runs `generate` with the same request. The noise comes from a CPU generator seeded by
the request alone, so any world size and layout start from the same latents and end with the same video. The
text encoder(s) live on the replica leader only: it encodes the prompts and broadcasts the text conditioning
to the replica's other ranks. Every rank holds the VAE and decodes a band of rows of the video
(`dit.vae_parallel`); the leader gathers the frames and is the one rank that returns them. Every rank loads
the tokenizer, so every rank validates a request on its own and rejects it the same way.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from functools import partial, wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import dit
import parallel
from dit.cache import Evaluations, StepCache, real_tokens
from dit.cache_config import CacheConfig
from dit.callbacks import DecodeCallback, FramesCallback, PhaseCallback, enter_phase
from dit.comm_choice import choose_comm
from dit.compile import compile_blocks
from dit.denoise_state import Checkpointing, DenoiseState, Expected, request_key, stamped, unusable
from dit.failures import DecodeCancelled, GenerationCancelled, GenerationFailed
from dit.families import (
    TINY_LIMITS,
    Limits,
    ModelFamily,
    model_family,
    model_limits,
    pick_scheduler,
)
from dit.first_frame import FirstFrame, with_first_frame
from dit.fp8_linear import quantise
from dit.image import check_image, fit, image_size
from dit.lora_catalogue import LoraCatalogue
from dit.lora_switch import LoraSwitch, check_lora_dir, lora_switch
from dit.parts import check_parts
from dit.preflight import ONE_EXPERT, check_settings
from dit.presets import resolve
from dit.preview import LatentPreview, PreviewCallback, read_preview, vae_preview
from dit.request import GenerationRequest, check_guidance, check_numbers, check_prompts, guided
from dit.sampling import (
    NUM_TRAIN_TIMESTEPS,
    Callback,
    HostOffload,
    SecondExpert,
    denoise,
)
from dit.sequence_parallel import set_comm
from dit.settings import DTYPE_NAMES, TWO_EXPERT_LORAS, PipelineConfig
from dit.text_cache import TextCache
from dit.vae_frames import cast_decoder

if TYPE_CHECKING:
    from dit.batch import BatchJob
    from dit.flow_schedulers import FlowScheduler

__all__ = [
    "DecodeCancelled",
    "GenerationCancelled",
    "GenerationFailed",
    "GenerationRequest",
    "Limits",
    "Pipeline",
    "PipelineConfig",
    "TINY_LIMITS",
    "load_pipeline",
    "load_prompt_tokenizer",
]

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def _one_at_a_time(method):
    """A pipeline's runs share its scheduler, step cache, decoder and applied LoRAs: calls from several
    threads take turns (two at once failed inside the scheduler, with an IndexError), and a call from inside
    a run on its own thread (a callback calling back into its pipeline) is a RuntimeError: it would have run
    on the shared state mid-run (the outer run failed with an IndexError, or returned 14 frames of 17). A
    run's own calls (`generate`'s denoise, then its decode) go through `_own`."""

    @wraps(method)
    def run(self, *args, **kwargs):
        me = threading.get_ident()
        if self._runner == me:
            if not self._handing_on:
                raise RuntimeError(
                    f"Pipeline.{method.__name__} was called from inside a run of the same pipeline (a "
                    "callback?): the two would share its scheduler and decoder; call it once the run is "
                    "over, or on another thread (it then waits its turn)"
                )
            self._handing_on = False  # once: the callbacks of the call it makes must not come back in
            return method(self, *args, **kwargs)
        with self._turn:
            self._runner, self._handing_on = me, False  # a hand-on made outside a run is not this run's
            try:
                return method(self, *args, **kwargs)
            finally:
                self._runner = None

    return run


class Pipeline:
    def __init__(
        self,
        config: PipelineConfig,
        mesh,
        family: ModelFamily,
        model,
        tokenizer,
        text_encoder,
        vae,
        limits: Limits,
        sampling: tuple[str, float, FlowScheduler],
        second: tuple[Any, float] | None = None,
        image_encoder=None,
        *,
        compression: tuple[int, int],
        expand_timesteps: bool = False,
        folder: Path | None = None,
        loras: LoraSwitch | None = None,
    ):
        self.config, self.mesh, self.family, self.model = config, mesh, family, model
        # `_one_at_a_time`: the thread whose run holds the turn (generate's through its denoise and decode)
        self._turn, self._runner, self._handing_on = threading.Lock(), None, False
        # the VAE's (time, space) compression; `expand_timesteps`: the model is a `dit.first_frame.FirstFrame`
        # (Wan2.2 TI2V-5B), whose image is the first latent frame
        self.compression, self.expand_timesteps = compression, expand_timesteps
        self.image_encoder = image_encoder  # an image-to-video model's, on the replica leader; else None
        # a two-expert model's low-noise expert and its boundary ratio (dit.wan.experts), else None, None
        self.model_2, self.boundary = second if second is not None else (None, None)
        self.tokenizer, self.limits = tokenizer, limits
        # LoRAs per request (`config.lora_dir`): the switch that applies them and the catalogue requests name
        # them from, or None
        self.lora_switcher = loras
        self.lora_catalogue: LoraCatalogue | None = loras.catalogue if loras is not None else None
        self.text_encoder = text_encoder  # None except on the replica leader
        self.texts = TextCache()  # recent prompts' text conditioning (the leader's)
        self.vae = vae  # on every rank when the replica decodes together, else on the leader alone
        # `families.pick_scheduler`'s choice; `denoise` resets the scheduler's state at every run
        self.sampler, self.flow_shift, self.scheduler = sampling
        self.evaluations: Evaluations | None = None  # the last completed generation's transformer passes
        # the latent → RGB map of live previews (dit.preview), on the replica leader when previews are on
        self.preview: LatentPreview | None = None
        if mesh.is_replica_leader and config.preview_every > 0 and vae is not None:
            channels, scale = model.config.in_channels, compression[1]
            self.preview = read_preview(folder, scale) or vae_preview(vae, family.decode, channels, scale)

    def validate(self, req: GenerationRequest) -> GenerationRequest:
        """The request with defaults filled in; ValueError naming the field and its allowed values if not."""
        _a_request(req)
        lim = self.limits
        if req.image is not None:  # its kind and shape: the pixels are fitted only when the job runs
            check_image(req.image)
        if lim.image_target_size and req.image is not None and req.height is None and req.width is None:
            height, width = self.family.video_size(*image_size(req.image), lim.image_target_size)
            req = replace(req, height=height, width=width)
        req = check_numbers(req, lim)
        if self.boundary is not None:  # as diffusers: the low-noise expert takes guidance_scale unless told
            if req.guidance_scale_2 is None:
                req = replace(req, guidance_scale_2=req.guidance_scale)
            check_guidance("guidance_scale_2", req.guidance_scale_2, lim)
        req = replace(req, cache=str(CacheConfig.parse(req.cache or self.config.cache)))
        if req.loras:
            if self.lora_catalogue is None:
                raise ValueError("loras: this pipeline has no LoRA catalogue (PipelineConfig.lora_dir)")
            self.lora_catalogue.plans(req.loras)  # every name known and every file fitting
        req = check_prompts(req)
        for name in ("prompt", "negative_prompt"):
            tokens = self.tokenizer.count_tokens(getattr(req, name))
            if tokens > lim.max_prompt_tokens:
                raise ValueError(
                    f"{name} is {tokens} tokens long; "
                    f"the text encoder accepts at most {lim.max_prompt_tokens}"
                )
        return req

    def set_comm(self, comm: str) -> None:
        """Switch the sequence-parallel exchange after load, between generations (`dit.comm_choice` picks one
        by measurement). Every rank of the replica must switch to the same mode."""
        for model in (self.model, self.model_2):
            if model is not None:
                set_comm(model, comm)
        self.config = replace(self.config, comm=comm)

    def choose_comm(self, allow_lossy: bool, timeout_s: float):
        """Time the exchanges at this model's attention shape and switch to the fastest (`dit.comm_choice`);
        the probe's result. Collective over the replica."""
        return choose_comm(self, self.mesh, allow_lossy, timeout_s)[1]

    def _validated(self, req: GenerationRequest) -> GenerationRequest:
        """`validate` on every rank of the replica alike. With LoRAs it reads each rank's own disk (the
        catalogue): when it fails on some ranks only (a file gone from one disk), GenerationFailed with the
        first one's reason on every rank, where the others waited in a collective that rank never reached;
        when on all, each raises its ValueError. Without LoRAs it is the same on every rank."""
        _a_request(req)
        group = self.mesh.replica_group
        if not req.loras or group is None:
            return self.validate(req)
        error = checked = None
        try:
            checked = self.validate(req)
        except ValueError as e:
            error = e
        mine = None if error is None else GenerationFailed(f"rank {self.mesh.rank}: {error}")
        failed, every = parallel.failures(mine, group, self.mesh.device)
        if every:
            raise error
        if failed is not None:
            raise failed
        return checked

    def apply_loras(self, loras: tuple[tuple[str, float], ...]) -> None:
        """Make a validated request's LoRA set (or none: the base) the applied one; every rank, before any
        forward of the job (GenerationFailed on every rank when one cannot). Nothing without a catalogue."""
        if self.lora_switcher is not None:
            self.lora_switcher.apply(loras, self.mesh.replica_group)

    @property
    def lora_switches(self) -> int:
        """How many times a job's LoRA set changed the weights (to another set or back to the base)."""
        return 0 if self.lora_switcher is None else self.lora_switcher.switches

    @property
    def lora_switch_seconds(self) -> float | None:
        """The last switch's seconds (restore + file reads + merge), None before the first."""
        return None if self.lora_switcher is None else self.lora_switcher.last_switch_s

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def latent_shape(self, req: GenerationRequest) -> tuple[int, ...]:
        t, s = self.compression
        channels = self.model.config.in_channels
        return (1, channels, (req.num_frames - 1) // t + 1, req.height // s, req.width // s)

    def initial_noise(self, req: GenerationRequest, generator: torch.Generator) -> torch.Tensor:
        """From `generator`, a CPU generator seeded by the request only: identical on every rank, device and
        world size."""
        noise = torch.randn(self.latent_shape(req), generator=generator, dtype=torch.float32)
        return noise.to(self.device)

    @_one_at_a_time
    def denoise(
        self,
        req: GenerationRequest,
        callback: Callback | None = None,
        on_phase: PhaseCallback | None = None,
        on_preview: PreviewCallback | None = None,
        resume: DenoiseState | None = None,
        checkpoints: Checkpointing | None = None,
    ) -> torch.Tensor:
        """Final latents (float32, the same on every rank). Raises GenerationCancelled on every rank.
        `on_phase(name)` hears "encoding" and "denoising" as each begins. `on_preview(step, image)` hears, on
        the replica leader only, a uint8 RGB `[H, W, 3]` preview of the video's middle frame (at most
        dit.preview.MAX_SIDE on its long side) every `config.preview_every` steps and after the last.
        `resume` (every rank) goes on from a checkpoint of this request; `checkpoints` (the leader only)
        hears the state every few steps (dit.denoise_state)."""
        req = self._validated(req)
        _hooks(callback=callback, on_phase=on_phase, on_preview=on_preview, checkpoints=checkpoints)
        # only where a state is made or read: it digests an image-to-video request's image
        key = request_key(req) if resume is not None or checkpoints is not None else None
        if resume is not None:
            replica = self.mesh.sp_size * self.mesh.cfg_size  # a step-cache state a rank
            shape = self.latent_shape(req)
            why = unusable(resume, Expected(req.num_inference_steps, shape, ranks=replica, request=key))
            if why is not None:
                raise ValueError(f"resume: the state does not fit this request: {why}")
        checkpoints = stamped(checkpoints, key)
        self.apply_loras(req.loras)
        enter_phase(on_phase, "encoding")
        cond, uncond = self.conditioning(req)
        enter_phase(on_phase, "denoising")
        # One stream from the seed: the initial noise, then the fresh noise of each renoise step.
        generator = torch.Generator("cpu").manual_seed(req.seed)
        cache = self.step_cache(CacheConfig.parse(req.cache))
        self.evaluations, counted = None, Evaluations()
        latents = denoise(
            self.model,
            self.initial_noise(req, generator),
            cond=cond,
            uncond=uncond,
            scheduler=self.scheduler,
            steps=req.num_inference_steps,
            guidance=req.guidance_scale,
            mesh=self.mesh,
            callback=callback,
            sigmas=self.sigmas(req.num_inference_steps),
            generator=generator,
            cache=cache,
            second=self.second_expert(req),
            evaluations=counted,
            on_x0=self.preview_hook(req.num_inference_steps, cond, on_preview),
            resume=resume,
            checkpoints=checkpoints,
        )
        self.evaluations = cache.stats if cache is not None else counted
        if "first_frame" in cond:  # as diffusers' expand_timesteps: the given frame, not the one sampled
            latents = with_first_frame(latents, cond["first_frame"])
        return latents

    def sigmas(self, steps: int) -> list[float] | None:
        """The unshifted sigmas `denoise` samples `steps` steps with: the fixed schedule's, the family's
        (HunyuanVideo-1.5's linspace), or None for the scheduler's own."""
        schedule = self.limits.schedule
        return self.family.sigmas(steps) if schedule is None else schedule.sigmas

    def preview_hook(self, steps: int, cond: dict, on_preview: PreviewCallback | None):
        """`denoise`'s `on_x0` for `on_preview` on the replica leader (None elsewhere, or when off)."""
        every = self.config.preview_every
        if on_preview is None or self.preview is None or every <= 0 or not self.mesh.is_replica_leader:
            return None

        def on_x0(step: int, x0: torch.Tensor) -> None:
            if step % every == 0 or step == steps:
                if "first_frame" in cond:  # the given frame, as the final latents will hold it
                    x0 = with_first_frame(x0, cond["first_frame"])
                on_preview(step, self.preview(x0))

        return on_x0

    def second_expert(self, req: GenerationRequest) -> SecondExpert | None:
        if self.model_2 is None:
            return None
        experts = (self.model, self.model_2)
        offload = HostOffload(experts, self.device) if self.config.offload_idle_expert else lambda model: None
        boundary = self.boundary * NUM_TRAIN_TIMESTEPS
        return SecondExpert(self.model_2, req.guidance_scale_2, boundary, offload)

    def step_cache(self, config: CacheConfig) -> StepCache | None:
        """A fresh cache for one generation (None when off), its sums taken over this replica."""
        if not config.enabled:
            return None
        return StepCache(
            config.threshold,
            real=real_tokens(self.model),
            reduce=partial(parallel.all_reduce_sum, group=self.mesh.replica_group),
            cfg_parallel=self.mesh.cfg_size == 2,
        )

    def conditioning(self, req: GenerationRequest) -> tuple[dict, dict | None]:
        """(prompt, negative prompt or None) text keyword arguments on this rank's device. The replica
        leader encodes both prompts its replica's passes use (the negative one when guided, or for
        CFG-parallel's cfg rank 1) and sends them to the other ranks in one broadcast over the gloo control
        group, as CPU tensors."""
        mesh, text = self.mesh, None
        shared = mesh.cfg_size * mesh.sp_size > 1  # other ranks in this replica wait for the leader's text
        if mesh.is_replica_leader:
            dtype = next(self.model.parameters()).dtype
            need_uncond = guided(req.guidance_scale, req.guidance_scale_2) or mesh.cfg_size == 2
            image = self.image_condition(req, dtype) if req.image is not None else {}
            text = (
                self.text_condition(req.prompt, dtype) | image,
                self.text_condition(req.negative_prompt, dtype) | image if need_uncond else None,
            )
            if shared:
                text = tuple(_on(part, torch.device("cpu")) for part in text)
        text = mesh.broadcast_object(text)
        return tuple(_on(part, self.device) for part in text)

    def text_condition(self, text: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The model's text keyword arguments (replica leader only); states in the model's dtype, masks as
        they come. Recent texts come from `self.texts`."""

        def encode(text: str) -> dict[str, torch.Tensor]:
            return {
                name: t.to(dtype) if t.is_floating_point() else t
                for name, t in self.text_encoder.condition(text).items()
            }

        return self.texts.get(text, encode)

    def image_condition(self, req: GenerationRequest, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """An image-to-video model's image keyword arguments (replica leader only): the conditioning volume
        from the VAE, and the image encoder's features when the model takes them; an `expand_timesteps`
        model's first latent frame (float32: it also goes into the final latents as it is). The VAE sees the
        image fit to the video's size (dit.image.fit: cover, then centre crop); the image encoder that or the
        image as given, as the family's reference does (`ImageEncoder.fitted`)."""
        image = fit(req.image, req.height, req.width)
        if self.expand_timesteps:
            return {"first_frame": self.family.first_frame(self.vae, image)}
        parts = {"condition": self.family.image_condition(self.vae, image, req.num_frames).to(dtype)}
        if self.image_encoder is not None:
            seen = image if self.image_encoder.fitted else req.image
            parts["encoder_hidden_states_image"] = self.image_encoder.encode(seen).to(dtype)
        return parts

    @_one_at_a_time
    def decode(
        self,
        latents: torch.Tensor,
        on_frames: FramesCallback | None = None,
        callback: DecodeCallback | None = None,
    ) -> np.ndarray | None:
        """uint8 frames `[F, H, W, 3]` on the replica leader, None on the other ranks. Collective over the
        replica (every rank passes the same latents): each rank decodes a band of rows, or the leader all of
        them when the config turns the parallel decode off. `on_frames` (the leader) gets the frames as they
        are decoded, a latent frame's at a time where the VAE decodes in time chunks (Wan's): an MP4
        writer takes them while the next ones decode. `callback(decoded, frames)` (the leader) is asked as
        each chunk is decoded, before its frames go to `on_frames`: False stops the decode, DecodeCancelled
        (a GenerationCancelled) on every rank."""
        channels = self.model.config.in_channels  # the latents it samples (`latent_shape`)
        if not isinstance(latents, torch.Tensor) or latents.dim() != 5 or latents.shape[:2] != (1, channels):
            shape = tuple(latents.shape) if isinstance(latents, torch.Tensor) else type(latents).__name__
            raise ValueError(f"decode takes one video's latents [1, {channels}, F, H, W], got {shape}")
        if not bool(torch.isfinite(latents).all()):  # every rank holds the same: each raises alike
            # the VAE's own check then blamed the decode's dtype
            raise GenerationFailed(
                f"the denoised latents hold non-finite values: the sampling diverged ({self.sampler}, flow "
                f"shift {self.flow_shift:g}; a shift far from the model's, or a float16 DiT's overflow); "
                "nothing was decoded"
            )
        if self.config.parallel_decode:
            return self.family.decode(self.vae, latents, self.mesh.replica_group, on_frames, callback)
        if not self.mesh.is_replica_leader:
            return None
        return self.family.decode(self.vae, latents, None, on_frames, callback)

    @_one_at_a_time
    def generate(
        self,
        req: GenerationRequest,
        callback: Callback | None = None,
        on_phase: PhaseCallback | None = None,
        on_preview: PreviewCallback | None = None,
        resume: DenoiseState | None = None,
        checkpoints: Checkpointing | None = None,
        on_frames: FramesCallback | None = None,
        decode_callback: DecodeCallback | None = None,
    ) -> np.ndarray | None:
        """Frames on the replica leader, None on the other ranks. `on_phase(name)` hears "encoding",
        "denoising" and "decoding" as each begins, so a server can show where a job is; `on_preview`,
        `resume` and `checkpoints` as in `denoise`, `on_frames` and `decode_callback` as `decode`'s
        `on_frames` and `callback` (a cancel during the decode). GenerationFailed (every rank alike) when
        the job cannot be made: a decode that overflowed."""
        _hooks(on_frames=on_frames, decode_callback=decode_callback)  # before the steps, not after them
        latents = self._own(self.denoise, req, callback, on_phase, on_preview, resume, checkpoints)
        enter_phase(on_phase, "decoding")
        return self._own(self.decode, latents, on_frames, decode_callback)

    def _own(self, call, *args):
        """A run's own call of another of the pipeline's runs (`_one_at_a_time` lets it in, once); from
        outside a run (dit.batch called directly), or from another thread's, an ordinary call."""
        if self._runner == threading.get_ident():
            self._handing_on = True
        return call(*args)

    @_one_at_a_time
    def generate_batch(
        self,
        jobs: list[BatchJob],
        on_phase: PhaseCallback | None = None,
        checkpoints: Checkpointing | None = None,
    ) -> list:
        """Jobs that may share every forward (`dit.batch.batch_key`; ValueError naming the field when they
        cannot) run as one batch: each job's frames on the replica leader (None on the other ranks), or its
        GenerationCancelled when its callback stopped it, or its decode's GenerationFailed, in the jobs'
        order (`dit.batch.generate_batch`; `checkpoints` hears each job's own state: `[(job index, state)]`).
        """
        from dit.batch import generate_batch  # dit.batch builds on this module

        return generate_batch(self, jobs, on_phase, checkpoints)


def _a_request(req) -> None:
    if not isinstance(req, GenerationRequest):  # a dict's AttributeError, from deep inside
        raise TypeError(f"a request is a GenerationRequest, got {type(req).__name__}")


def _hooks(checkpoints=None, **hooks) -> None:
    """TypeError naming a run's hook that is not callable, or `checkpoints` that is no Checkpointing: said
    before the run (callback=5 failed after the text encoding, deep in the sampler)."""
    for name, hook in hooks.items():
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable, got {hook!r:.80}")
    if checkpoints is not None and not isinstance(checkpoints, Checkpointing):
        raise TypeError(f"checkpoints takes a Checkpointing, got {checkpoints!r:.80}")


def _on(text: dict[str, torch.Tensor] | None, device: torch.device) -> dict[str, torch.Tensor] | None:
    return None if text is None else {name: t.to(device) for name, t in text.items()}


log = logging.getLogger("ithaca.pipeline")


def load_prompt_tokenizer(model: str):
    """The prompt tokenizer of a preset or pipeline folder (`count_tokens(text)`, `max_tokens`) without the
    model: the API process counts a prompt's tokens with it before queuing the job."""
    model = resolve(model)
    folder = Path(model) if Path(model).is_dir() else None
    return model_family(model).tokenizer(folder)


def _part(name: str, load, *args):
    """`load(*args)`, its ValueError naming the part."""
    try:
        return load(*args)
    except ValueError as e:
        raise ValueError(f"{name}/: {e}") from None


def load_pipeline(config: PipelineConfig, mesh=None) -> Pipeline:
    """Build the pipeline on this rank. `config.model` is a preset or a diffusers pipeline folder (its
    `transformer/`, text encoder(s) + tokenizer(s), `vae/`, `scheduler/`); the family (Wan2.1 or
    HunyuanVideo-1.5) comes from the transformer's `_class_name`. A preset without a folder pairs the DiT with
    the family's tiny text encoder(s) and VAE (random weights, for development and benchmarks)."""
    if not isinstance(config, PipelineConfig):  # a dict's AttributeError, from deep inside
        raise TypeError(f"load_pipeline takes a PipelineConfig, got {type(config).__name__}")
    # what the command line refuses before any rank starts: a quant of another name loaded the model
    # unquantised, a flow shift of -1 failed at the decode, naming its dtype
    check_settings(config, named=str)
    mesh = mesh if mesh is not None else parallel.init_parallel()
    device = torch.device(config.device) if config.device else mesh.device
    dtype = DTYPES[config.dtype]
    model_name = resolve(config.model)
    folder = Path(model_name) if Path(model_name).is_dir() else None
    family = model_family(model_name)
    if folder is not None:
        check_parts(folder)
        lacking = [f"{part}/" for part in ("vae", "text_encoder") if not (folder / part).is_dir()]
        if lacking and mesh.rank == 0:  # a transformer folder alone: said once, as it is no mistake
            log.warning(
                "%s has no %s: tiny random stand-ins take the place (the video is noise unless the "
                "transformer is tiny too); give the pipeline folder, or link its parts in", folder,
                " or ".join(lacking),
            )  # fmt: skip
    # the sampler and any fixed schedule, decided before any weights load
    *sampling, schedule = pick_scheduler(family, folder, config.sampler, config.flow_shift, config.timesteps)

    boundary = family.boundary_ratio(model_name, folder)
    expand = family.expand_timesteps(folder, model_name)
    if boundary is not None and config.loras:
        raise ValueError(TWO_EXPERT_LORAS)
    if config.offload_idle_expert and boundary is None:
        raise ValueError(f"offload_idle_expert {ONE_EXPERT}")
    check_lora_dir(config)
    raw = []  # (raw transformer, its source, FP8 layers' unquantised weights): LoRAs per request change it
    # a LoRA per request is added to unquantised weights: a pre-quantised checkpoint is then dequantised
    quant_stored = config.quant if config.lora_dir is None else "none"

    def transformer(source, seed=0):
        model = dit.load_transformer(
            source, dtype=dtype, device=device, loras=config.loras, seed=seed, quant=quant_stored
        )
        unquantised: dict[str, torch.Tensor] = {}
        raw.append((model, source, unquantised))
        if config.quant == "fp8":  # after the LoRAs are merged; a pre-quantised checkpoint's layers stay
            quantise(model, keep=unquantised if config.lora_dir else None)
        model = dit.parallelize(
            family.wrap(model.eval(), folder, model_name), mesh, comm=config.comm, backend=config.attn_backend
        )
        model = FirstFrame(model) if expand else model
        return compile_blocks(model) if config.compile else model

    model = transformer(model_name)
    second = None if boundary is None else (transformer(*family.second_source(model_name, folder)), boundary)
    if second is not None and config.offload_idle_expert:
        second[0].to("cpu")  # in host memory until its first turn
    tokenizer = family.tokenizer(folder)
    # The replica leader alone encodes text; every rank decodes a band of the video (its activations, the
    # bulk of a decode's memory, shrink with the ranks).
    leader = mesh.is_replica_leader
    text_device = torch.device(config.text_encoder_device) if config.text_encoder_device else device
    text_encoder = image_encoder = error = None
    if leader:
        try:  # weights that do not fit their config are found only as they load
            text_encoder = _part(
                "text_encoder", family.text_encoder, folder, model, tokenizer, dtype, text_device
            )
            image_encoder = _part("image_encoder", family.image_encoder, folder, model, dtype, text_device)
        except ValueError as e:
            error = e
    if mesh.control_group is not None:  # every rank fails alike (one line, exit 2): the others waited in a
        # collective the leader left, and ended in its traceback
        error = parallel.first_failure(error, mesh.control_group, torch.device("cpu"))
    if error is not None:
        raise error
    decodes = leader or config.parallel_decode
    vae = family.vae(folder, model.config.in_channels, device) if decodes else None
    if vae is not None:  # its decoder in --vae-dtype; the encoder stays float32
        cast_decoder(vae, DTYPES[config.vae_dtype])

    channels = model.config.in_channels
    compression = family.compression_of(folder, channels)
    limits = replace(
        model_limits(family, folder, model_name, raw[0][0].config, channels, model.config.patch_size),
        max_prompt_tokens=tokenizer.max_tokens,
    ).with_schedule(schedule)
    return Pipeline(
        config, mesh, family, model, tokenizer, text_encoder, vae, limits, sampling, second, image_encoder,
        compression=compression, expand_timesteps=expand, folder=folder, loras=lora_switch(config, raw),
    )  # fmt: skip
