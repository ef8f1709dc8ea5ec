"""The sizing table is computed from the model shapes, and deploy/README.md shows exactly what it computes."""

from pathlib import Path

from scripts import sizing


def test_table_matches_the_models_and_the_operator_guide():
    rows = sizing.table()
    by = {(r["model"], r["resolution"], r["ranks"]): r for r in rows}
    wan14 = by["Wan2.1 14B", "480p", 1]
    assert wan14["tokens"] == 21 * 30 * 52 and round(wan14["dit_params_b"], 2) == 14.29
    assert round(by["Wan2.1 1.3B", "480p", 1]["dit_params_b"], 2) == 1.42  # diffusers' count for the config
    # Sequence parallelism divides activations, never the (replicated) DiT weights; every rank holds the VAE
    # (each decodes a band), the leader alone the text encoder.
    gib = lambda billions, nbytes: billions * 1e9 * nbytes / 2**30
    dit_gib = gib(wan14["dit_params_b"], 2) + gib(wan14["vae_params_b"], 4)  # the VAE decodes in fp32
    text_gib = gib(wan14["text_params_b"], 2)
    assert wan14["other_gib"] is None  # one rank: the leader alone
    assert abs(wan14["leader_gib"] - dit_gib - text_gib - wan14["activations_gib"]) < 1e-9
    for ranks in (2, 4, 8):
        r = by["Wan2.1 14B", "720p", ranks]
        assert abs(r["activations_gib"] * ranks - by["Wan2.1 14B", "720p", 1]["activations_gib"]) < 0.01
        assert abs(r["other_gib"] - dit_gib - r["activations_gib"]) < 1e-9
        assert abs(r["leader_gib"] - r["other_gib"] - text_gib) < 1e-9
    assert 10.5 < text_gib < 10.7  # UMT5-XXL (5.68 B) bf16: what the other ranks do not hold
    assert by["Wan2.1 14B", "480p", 8]["other_gib"] < 28 < by["Wan2.1 14B", "480p", 8]["leader_gib"] < 40
    assert by["Wan2.1 1.3B", "480p", 8]["ulysses_heads"] == (2, 1)  # 12 heads: uneven Ulysses
    guide = (Path(__file__).parents[1] / "deploy" / "README.md").read_text()
    assert sizing.markdown(rows) in guide, "regenerate the table: python scripts/sizing.py"
