"""Automatic layout (parallel/plan.py): the rule's choices, the bytes of the Wan2.1-14B 8-GPU table, `ithaca
plan`'s output, and `auto` in the server's settings."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

import pytest

from dit.presets import SHIPPED
from parallel.plan import REFERENCE, Layout, Shape, choose, estimate, link_bytes, requested
from server.config import ServeConfig, add_arguments, from_args

WAN14 = REFERENCE  # 40 heads, 32760 tokens, guided
WAN13 = Shape("wan2.1-1.3b", 12, 128, 30, 8960, 32760, 16 * 21 * 60 * 104, True)
TINY2 = Shape("two heads", 2, 16, 2, 64, 256, 16 * 5 * 16 * 16, False)


def _auto(world, shape, **kw) -> tuple[int, int, int]:
    layout = choose(world, shape, **kw).layout
    return layout.ulysses, layout.ring, layout.cfg


@pytest.mark.parametrize(
    "world,shape,node,want",
    [
        (8, WAN14, None, (4, 1, 2)),  # guided, even: CFG parallel, Ulysses on the 4 left
        (8, replace(WAN14, guided=False), None, (8, 1, 1)),
        (8, WAN13, None, (4, 1, 2)),  # 12 heads over 4: even
        # 12 heads over 8 leave the slowest rank 2 (1.5 even): ulysses 4 × ring 2 models faster
        (8, replace(WAN13, guided=False), None, (4, 2, 1)),
        # 40 heads over 3: the slowest rank 14 (13.3 even); the ring models faster and divides the heads
        (6, WAN14, None, (1, 3, 2)),
        (3, WAN14, None, (1, 3, 1)),  # odd: no CFG parallel
        (1, WAN14, None, (1, 1, 1)),
        (2, WAN14, None, (1, 1, 2)),
        (16, WAN14, 8, (8, 1, 2)),  # CFG across the nodes, Ulysses within each
        (16, replace(WAN14, guided=False), 8, (8, 2, 1)),  # the ring across the nodes
        (4, TINY2, None, (2, 2, 1)),  # Ulysses stops at the head count, the ring takes the rest
        (4, replace(TINY2, guided=True), None, (2, 1, 2)),
    ],
)
def test_auto_choices(world, shape, node, want):
    assert _auto(world, shape, node=node) == want


def test_the_reason_says_why():
    assert choose(8, WAN14).line() == (
        "layout: ulysses 4 × ring 1 × cfg 2 "
        "(auto: guided, so CFG parallel; 4 ranks left, Ulysses within the node, 40 heads)"
    )
    assert "ring 2 across nodes" in choose(16, replace(WAN14, guided=False), node=8).reason
    assert "ulysses 8 would give the slowest rank 2 heads" in choose(8, replace(WAN13, guided=False)).reason
    # a degree given: the other is what it leaves (it said "ring 2 past 40 heads", "the ranks do not split")
    assert choose(2, WAN14, ulysses="auto", ring=2, cfg="auto").reason == (
        "auto: guided, but the 2 sequence ranks given leave no second branch, so no CFG parallel; "
        "ulysses 1 × ring 2: what the ring 2 given leaves of 2 ranks"
    )


def test_uneven_heads_are_allowed_when_nothing_else_fits():
    # 8 ranks, 6 heads, one node: ulysses 8 is out (more ranks than heads); 4 (uneven) and 2 compete
    shape = replace(WAN13, heads=6, guided=False)
    u, r, c = _auto(8, shape)
    assert u * r == 8 and u <= 6 and c == 1
    assert estimate(Layout.of(4, 2, 1), shape, 1.0).heads_per_rank == 2


def test_fixed_and_mixed_degrees():
    assert requested(None, None, None) == ("auto", "auto", "auto")
    assert requested(None, None, 2) == (None, 1, 2)  # as before: ulysses what remains, ring 1
    assert requested(None, "auto", None) == ("auto", "auto", "auto")  # no integer given: all auto
    assert requested(None, "auto", 2) == ("auto", "auto", 2)  # ulysses follows the ring it waits on
    assert choose(8, None, 8).reason == "as given"
    assert _auto(8, WAN14, cfg=1) == (8, 1, 1)
    assert _auto(8, WAN14, ulysses=8, cfg="auto") == (8, 1, 1)  # no room left for CFG parallel
    assert _auto(8, WAN14, ulysses="auto", ring=2, cfg="auto") == (2, 2, 2)
    assert _auto(8, WAN14, ring=2, cfg="auto") == (2, 2, 2)  # the ring given stays (it became ring 1)
    assert _auto(4, WAN14, ring=2, cfg="auto") == (1, 2, 2)
    with pytest.raises(ValueError, match="ring=3 x cfg=1 does not divide world size 8; valid"):
        choose(8, WAN14, ring=3)
    with pytest.raises(ValueError, match="ulysses=3 x ring=1 x cfg=1 does not divide world size 8"):
        choose(8, WAN14, ulysses=3, ring="auto")


def test_bytes_match_the_wan14b_8gpu_table():
    """GB sent per forward per rank in bench/RESULTS.md's MODELLED table (bench/gpu_modelled.py before the
    model moved to parallel/plan.py)."""
    S, H, D, layers = 32760, 40, 128, 40
    for layout, alltoall, fp8 in (
        (Layout("Ulysses 8", 8), 5.87, 3.03),
        (Layout("CFG 2 × Ulysses 4", 4, cfg=2), 10.06, 5.19),
        (Layout("ring 2 × Ulysses 4", 4, ring=2), 8.39, 5.95),
    ):
        assert round(layers * link_bytes(layout, S, H, D) / 1e9, 2) == alltoall
        assert round(layers * link_bytes(layout, S, H, D, fp8=True) / 1e9, 2) == fp8
    # the table's step times (NVLink) without text: compute 2.838 s / 8 = 0.355 s, step 0.736 s
    e = estimate(Layout("Ulysses 8", 8), replace(WAN14, text_tokens=0), 2.838)
    assert (round(e.compute_s, 3), round(e.step_s, 3)) == (0.355, 0.736)
    cfg = estimate(Layout("CFG 2 × Ulysses 4", 4, cfg=2), replace(WAN14, text_tokens=0), 2.838)
    assert round(cfg.step_s, 3) == 0.732
    assert estimate(Layout.of(4, 1, 2), replace(WAN14, guided=False), 2.838).step_s is None


def test_ithaca_plan_prints_the_table_and_marks_the_choice(capsys):
    from server.cli import main

    assert main(["plan", "--nproc", "8", "--preset", "wan2.1-14b"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "wan2.1-14b, 81 frames 480×832: 32760 tokens, 40 heads × 128, 40 layers, guided; 8 ranks" in out
    assert "MODELLED, not measured" in out and "2.82 s at 32760 tokens" in " ".join(out.split())
    rows = [line.split() for line in lines if re.match(r"[* ] +\d", line)]
    assert len(rows) == 7  # every layout of 8 ranks (cfg 1 or 2)
    marked = next(r for r in rows if r[0] == "*")
    assert marked[1:4] == ["4", "1", "2"] and marked[-1] == "0.73"
    assert "\n* auto picks layout: ulysses 4 × ring 1 × cfg 2 (auto: guided" in out

    assert (
        main(["plan", "--nproc", "16", "--nproc-per-node", "8", "--preset", "wan2.1-14b", "--guidance", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "unguided; 16 ranks on 2 nodes of 8" in out and "n/a: CFG parallel needs guidance" in out
    assert "\n* auto picks layout: ulysses 8 × ring 2 × cfg 1" in out
    assert main(["plan", "--nproc", "6", "--nproc-per-node", "4"]) == 2
    assert "--nproc-per-node 4 does not divide --nproc 6" in capsys.readouterr().err
    for bad in ("0", "-2"):  # 0 read as "not given", -2 as a divisor: both ran
        assert main(["plan", "--nproc", "8", "--nproc-per-node", bad]) == 2
        assert f"--nproc-per-node must be a positive integer, got {bad}" in capsys.readouterr().err
    assert main(["plan", "--nproc", "2", "--model-path", str(SHIPPED["tiny"])]) == 0  # a folder, not a name
    assert "17 frames 64×64: 80 tokens, 4 heads × 32, 4 layers, guided; 2 ranks" in capsys.readouterr().out
    assert main(["plan", "--nproc", "2", "--frames", "-5"]) == 2  # the video against the model's limits
    assert "--frames must be 4k+1 between 5 and 33, got -5" in capsys.readouterr().err
    for i2v in ("tiny-joint-i2v", "wan2.1-i2v-14b-480p"):  # a size to plan, no first frame (it was refused)
        assert main(["plan", "--nproc", "4", "--preset", i2v]) == 0, capsys.readouterr().err
        assert "auto picks layout" in capsys.readouterr().out


def _parse(argv, env=None) -> ServeConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return from_args(parser.parse_args(argv), environ=env or {})


def test_serve_config_takes_auto():
    config = _parse([])
    assert (config.ulysses, config.ring, config.cfg) == (None, None, None)  # all auto
    config = _parse(["--ulysses", "auto", "--cfg", "2"], {"ITHACA_RING": "auto"})
    assert (config.ulysses, config.ring, config.cfg) == ("auto", "auto", 2)
    argv = config.worker_argv()
    assert argv[argv.index("--ulysses") + 1] == "auto" and argv[argv.index("--cfg") + 1] == "2"
    assert _parse(["--ulysses", "4"]).ulysses == 4
    with pytest.raises(ValueError, match="ITHACA_CFG: 'two' is not an integer or auto"):
        _parse([], {"ITHACA_CFG": "two"})


def test_serve_resolves_auto_for_the_model():
    from dit.shape import plan_layout

    assert plan_layout("tiny", 2).layout == Layout.of(1, 1, 2)  # the trained tiny model is guided (3.0)
    assert plan_layout("tiny-random", 4, cfg=1).layout == Layout.of(4, 1, 1)
    assert plan_layout("wan2.1-14b", 8, timesteps="1000,750,500,250", sampler="euler").layout == Layout.of(
        8, 1, 1
    )  # a fixed schedule: guidance 1, so no CFG parallel


def test_generate_plans_for_its_own_request():
    """`generate --guidance 1` is unguided: no CFG parallel (it planned for the model's default guidance)."""
    from dit.pipeline import GenerationRequest
    from dit.shape import plan_layout, request_video

    unguided = request_video(GenerationRequest("a fox", guidance_scale=1.0))
    assert plan_layout("tiny", 2, video=unguided).layout == Layout.of(2, 1, 1)
    guided = request_video(GenerationRequest("a fox"))  # the model's default guidance, 3
    assert plan_layout("tiny", 2, video=guided).layout == Layout.of(1, 1, 2)


def test_text_tokens_work_that_every_rank_repeats():
    """Cross-attention's text K/V projections (4·T·d² a layer) run on every rank: at 8 ranks they add their
    whole share to each rank's compute, not an eighth; joint text lengthens the attention instead."""
    forward, plain = 2.838, replace(WAN14, text_tokens=0)
    attention, by_tokens, everywhere = WAN14.flops()
    d = WAN14.heads * WAN14.head_dim
    assert everywhere == WAN14.layers * 4 * 512 * d * d
    assert by_tokens == plain.flops()[1] + WAN14.layers * 4 * WAN14.tokens * 512 * d
    e = estimate(Layout("Ulysses 8", 8), WAN14, forward)
    total = attention + by_tokens + everywhere
    assert e.compute_s == pytest.approx(forward * ((attention + by_tokens) / 8 + everywhere) / total)
    joint = replace(plain, text_tokens=1256, joint_text=True)
    assert joint.flops()[0] == WAN14.layers * 4 * (WAN14.tokens + 1256) ** 2 * d
    assert joint.flops()[2] == 1256 * plain.flops()[1] / plain.tokens  # text tokens' own linears, everywhere


def test_every_shipped_model_gets_a_layout_on_1_to_8_ranks():
    """`ithaca serve --nproc N` with no degrees given: for every model name and N = 1..8 auto finds a layout
    that fits (degrees divide N, Ulysses at most the heads) and the settings pass the launch's checks."""
    from dit.families import model_names
    from dit.preflight import preflight
    from dit.shape import model_shape, plan_layout

    for model in model_names():
        heads = model_shape(model).heads
        for n in range(1, 9):
            layout = plan_layout(model, n).layout
            assert n % (layout.sp * layout.cfg) == 0 and layout.ulysses <= heads, (model, n, layout)
            preflight(preset=model, device="cpu", nproc=n, comm="auto")


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`ithaca plan ... | head -1`: the rest of the table meets a closed pipe."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    ithaca = shutil.which("ithaca") or str(Path(sys.executable).parent / "ithaca")
    proc = subprocess.run(f"'{ithaca}' plan --nproc 8 --preset wan2.1-14b | head -c 1", shell=True, text=True,
                          capture_output=True, timeout=60)  # fmt: skip
    assert proc.stdout == "w" and proc.stderr == "", proc.stderr


def test_a_two_expert_models_low_noise_guidance_alone_makes_it_guided(capsys):
    """Guidance 1 with a --guidance-2 of 3 runs the negative prompt's pass below the boundary: it was planned
    unguided (auto gave no CFG parallel, the step modelled as one forward), --cfg 2 was refused, and
    parity's cfg row skipped."""
    from dit.preflight import preflight
    from dit.request import GenerationRequest
    from server.cli import main

    argv = ["plan", "--nproc", "4", "--preset", "tiny-moe-random", "--guidance", "1"]
    assert main([*argv, "--guidance-2", "3"]) == 0
    assert ", guided; 4 ranks" in capsys.readouterr().out
    assert main(argv) == 0 and ", unguided; 4 ranks" in capsys.readouterr().out
    low_noise_only = GenerationRequest("fox", guidance_scale=1.0, guidance_scale_2=3.0)
    preflight(preset="tiny-moe-random", device="cpu", nproc=2, ulysses=1, cfg=2, request=low_noise_only)
    with pytest.raises(ValueError, match="^--cfg 2 runs the negative prompt's pass on half the ranks"):
        unguided = GenerationRequest("fox", guidance_scale=1.0, guidance_scale_2=1.0)
        preflight(preset="tiny-moe-random", device="cpu", nproc=2, ulysses=1, cfg=2, request=unguided)
    assert main(["plan", "--nproc", "1", "--preset", "tiny-moe-random"]) == 0
    assert ", guided; 1 rank\n" in capsys.readouterr().out  # "1 ranks"
    assert main(["plan", "--nproc", "2", "--guidance-2", "3"]) == 2  # the tiny model has one expert
    assert "--guidance-2 is for two-expert models" in capsys.readouterr().err
