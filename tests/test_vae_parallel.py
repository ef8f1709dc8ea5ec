"""Band-parallel VAE decode (gloo, CPU): the halo and gather primitives, diffusers' `decode` on the same
weights against the banded decode at 1-4 ranks for Wan2.1's and Wan2.2's VAEs (ours) and HunyuanVideo-1.5's
(diffusers', a latent frame at a time: `dit.hunyuan.vae_chunks`), tiny configs, latent heights that split
unevenly; and a whole pipeline at Ulysses 2 giving one rank's frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tests.distributed import run_distributed

REL = 1e-5  # float32 against diffusers' decode on the same weights (measured ≤ 2.7e-6 at 1-4 ranks)
# (family, latent channels, latent [frames, rows, cols]); 7 rows split 4+3, 3+2+2 and 2+2+2+1, and 3 rows are
# fewer than 4 ranks (the leader decodes alone there); 48 channels: Wan2.2's VAE (residual blocks, unpatchify)
CASES = [("wan", 4, (2, 7, 5)), ("hunyuan", 4, (2, 7, 3)), ("wan", 4, (3, 3, 4)), ("wan", 48, (2, 7, 3))]


def same_frames(a: np.ndarray, b: np.ndarray) -> bool:
    """uint8 frames equal but where a value lies within float32 rounding of a level boundary (x.49998 against
    x.5 rounds either way). An error of REL of the peak is 1.3e-3 of a level, so at most ~2.6e-3 of evenly
    spread values may flip; measured 0-4 values of 21-81 thousand (≤ 9.7e-5) at 1-4 ranks (CPU: oneDNN's
    convolution, `dit.conv3d`, against diffusers' through torch's native one)."""
    diff = np.abs(a.astype(int) - b.astype(int))
    return diff.max() <= 1 and (diff > 0).mean() <= 5e-4


def _vae(family: str, channels: int):
    if family == "wan":
        from dit.wan.vae import tiny_vae
    else:
        from dit.hunyuan.vae import tiny_vae
    return tiny_vae(channels, seed=1)


def _reference(family: str, channels: int, z: torch.Tensor) -> torch.Tensor:
    """diffusers' decode of `_vae(family, channels)`'s weights."""
    from testing.wan_vae import diffusers_wan_vae

    vae = _vae(family, channels)
    return (diffusers_wan_vae(vae) if family == "wan" else vae).decode(z).sample


def _latents(channels: int, shape: tuple[int, int, int]) -> torch.Tensor:
    return torch.randn(1, channels, *shape, generator=torch.Generator().manual_seed(sum(shape)))


def _banded_decodes(cases):
    """Per case: the banded decode over the whole world, and afterwards the same VAE's own decode (the hooks
    and paddings must be gone)."""
    import torch.distributed as dist

    from dit import vae_parallel
    from dit.hunyuan.vae_chunks import streamed

    out = []
    for family, channels, shape in cases:
        vae, z = _vae(family, channels), _latents(channels, shape)
        vae = streamed(vae) if family == "hunyuan" else vae  # as loaded: a latent frame at a time
        banded = vae_parallel.decode(vae, z, dist.group.WORLD)
        left = [m for m in vae.modules() if m._forward_pre_hooks or m._forward_hooks]
        out.append(dict(video=banded, after=vae_parallel.decode(vae, z), hooks_left=len(left)))
    return out


@pytest.fixture(scope="module")
def references():
    return [_reference(family, c, _latents(c, shape)) for family, c, shape in CASES]


@pytest.mark.parametrize("world", [1, 2, pytest.param(3, marks=pytest.mark.slow), 4])
def test_banded_decode_matches_diffusers(references, world):
    from dit.vae_frames import to_uint8

    ranks = run_distributed(world, _banded_decodes, CASES, timeout=180)
    for (family, _, shape), want, leader in zip(CASES, references, ranks[0], strict=True):
        got = leader["video"]
        rel = ((got - want).abs().max() / want.abs().max()).item()
        print(f"{family} latent {shape} at {world} ranks: max relative difference {rel:.1e}")
        assert got.shape == want.shape and rel <= REL, (family, shape, rel)
        assert same_frames(to_uint8(got), to_uint8(want)), (family, shape)
    for rank in ranks:  # every rank's VAE is itself again
        for case, want, result in zip(CASES, references, rank, strict=True):
            assert result["hooks_left"] == 0, case
            assert ((result["after"] - want).abs().max() / want.abs().max()).item() <= REL, case
    assert all(result["video"] is None for rank in ranks[1:] for result in rank)


def _one_band_overflows():
    """Rank 1's band of the first decode overflows: (what each rank raised, the next decode's video)."""
    import torch.distributed as dist

    from dit import vae_parallel
    from dit.failures import GenerationFailed
    from dit.vae_frames import quantize

    vae, z, group = _vae("wan", 4), _latents(4, (2, 7, 5)), dist.group.WORLD
    scale = float("inf") if dist.get_rank() == 1 else 1.0
    try:
        vae_parallel.decode(vae, z, group, finish=lambda band: quantize(band * scale))
        failed = None
    except GenerationFailed as e:
        failed = str(e)
    return failed, vae_parallel.decode(vae, z, group, finish=quantize)


def test_a_band_that_overflows_fails_every_rank_alike_and_the_group_goes_on():
    (failed, video), (failed_too, nothing) = run_distributed(2, _one_band_overflows, timeout=60)
    assert failed == failed_too and "gave non-finite values" in failed  # rank 1's error, on rank 0 too
    assert video.dtype == torch.uint8 and video.shape == (1, 3, 5, 56, 40) and nothing is None


def _primitives(alone: bool = False):
    """Halo exchange and band gathers of a [2, 9, 3] tensor split 3+2+2+2 along dim 1, against slicing;
    `alone`: one rank without a process group (a mesh of world size 1: its groups are None)."""
    import torch.distributed as dist

    import parallel

    group = None if alone else dist.group.WORLD
    whole = torch.arange(2 * 9 * 3, dtype=torch.float32).view(2, 9, 3) + 1
    bands = parallel.RowBands.split(9, group)
    band = bands.own(whole, 1, list(bands.sizes))
    start, rows = sum(bands.sizes[: bands.rank]), bands.sizes[bands.rank]
    out = {}
    for edge, mode in (("zeros", "constant"), ("replicate", "replicate")):
        padded = torch.nn.functional.pad(whole[None], (0, 0, 2, 1), mode=mode)[0]  # 2 rows above, 1 below
        with parallel.count_comm() as stats:
            got = bands.exchange(band, 1, 2, 1, edge)
        out[edge] = (torch.equal(got, padded[:, start : start + rows + 3]), dict(stats.calls))
    below = torch.nn.functional.pad(whole, (0, 0, 0, 2))  # one-sided: rows from below only
    out["one_sided"] = torch.equal(bands.exchange(band, 1, 0, 2, "zeros"), below[:, start : start + rows + 2])
    out["all_gather"] = torch.equal(bands.all_gather(band, 1)[0], whole)
    twice = band.repeat_interleave(2, dim=1)  # the bands at twice the resolution
    gathered = bands.gather(twice, 1)
    out["gather"] = None if gathered is None else torch.equal(gathered, whole.repeat_interleave(2, dim=1))
    return out


def test_halo_exchange_and_gathers_match_slicing():
    ranks = run_distributed(4, _primitives)  # after the 4-rank decodes: the same pool
    for rank, out in enumerate(ranks):
        neighbours = (rank > 0) + (rank < 3)
        for edge in ("zeros", "replicate"):
            assert out[edge][0], (rank, edge)
            assert out[edge][1] == {"send": neighbours, "recv": neighbours}
        assert out["one_sided"] and out["all_gather"]
        assert out["gather"] is (True if rank == 0 else None)
    alone = _primitives(alone=True)  # the README's block at world size 1 needed a process group
    assert all(alone[edge] == (True, {}) for edge in ("zeros", "replicate"))
    assert alone["one_sided"] and alone["all_gather"] and alone["gather"]


def test_unknown_layers_are_refused():
    import parallel
    from dit.vae_parallel import banded

    vae = _vae("wan", 4)
    vae.decoder.norm_out = nn.GroupNorm(1, vae.decoder.norm_out.gamma.shape[0])  # mixes rows: not row-local
    with pytest.raises(ValueError, match="GroupNorm is not known to be row-local"):
        with banded(vae, parallel.RowBands((4, 3), 0, None)):
            pass


REQUEST = dict(prompt="a red circle moving right", num_frames=9, height=48, width=64, num_inference_steps=2)


def _generate(model, degrees, **config):
    import parallel
    from dit.pipeline import GenerationRequest, PipelineConfig, load_pipeline

    mesh = parallel.init_parallel(**degrees)
    pipe = load_pipeline(PipelineConfig(model=model, device="cpu", **config), mesh)
    phases, chunks = [], []
    with parallel.count_comm() as stats:
        frames = pipe.generate(GenerationRequest(**REQUEST), on_phase=phases.append, on_frames=chunks.append)
    return dict(frames=frames, phases=phases, gathers=stats.calls["gather"], has_vae=pipe.vae is not None,
                chunks=chunks)  # fmt: skip


# the frames the leader gets as they decode: a latent frame at a time (Wan's VAE; HunyuanVideo-1.5's streamed)
CHUNKS = {"tiny": [1, 4, 4], "tiny-joint": [1, 4, 4]}


@pytest.mark.parametrize("model", ["tiny", "tiny-joint"])
def test_pipeline_at_ulysses_2_gives_one_ranks_frames(model):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks run: Ulysses is bit-identical with the same kernels' reductions
    try:
        want = _generate(model, {})["frames"]
    finally:
        torch.set_num_threads(threads)
    leader, other = run_distributed(2, _generate, model, dict(ulysses=2), timeout=180)
    assert same_frames(leader["frames"], want) and other["frames"] is None
    assert [len(c) for c in leader["chunks"]] == CHUNKS[model] and other["chunks"] == []
    assert np.array_equal(np.concatenate(leader["chunks"]), leader["frames"])
    for rank in (leader, other):  # both decode (a band each; a gather to the leader per chunk) and say so
        assert rank["phases"] == ["encoding", "denoising", "decoding"]
        assert rank["gathers"] == len(CHUNKS[model])
    # with the parallel decode off the leader alone holds the VAE and decodes the same frames
    leader, other = run_distributed(2, _generate, model, dict(ulysses=2), parallel_decode=False, timeout=180)
    assert same_frames(leader["frames"], want) and other["frames"] is None
    assert (leader["has_vae"], other["has_vae"], leader["gathers"], other["gathers"]) == (True, False, 0, 0)
