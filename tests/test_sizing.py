"""The sizing table is computed from the model shapes, and deploy/README.md shows exactly what it computes."""

from pathlib import Path

from dit import sizing


def test_table_matches_the_models_and_the_operator_guide():
    rows = sizing.table()
    by = {(r["model"], r["resolution"], r["ranks"]): r for r in rows}
    wan14 = by["Wan2.1 14B", "480p", 1]
    assert wan14["tokens"] == 21 * 30 * 52 and round(wan14["dit_params_b"], 2) == 14.29
    assert round(by["Wan2.1 1.3B", "480p", 1]["dit_params_b"], 2) == 1.42  # diffusers' count for the config
    # Sequence parallelism divides activations, never the (replicated) weights.
    for ranks in (2, 4, 8):
        r = by["Wan2.1 14B", "720p", ranks]
        assert r["weights_gib"] == wan14["weights_gib"]
        assert abs(r["activations_gib"] * ranks - by["Wan2.1 14B", "720p", 1]["activations_gib"]) < 0.01
    assert not by["Wan2.1 1.3B", "480p", 8]["ulysses_ok"]  # 12 heads
    guide = (Path(__file__).parents[1] / "deploy" / "README.md").read_text()
    assert sizing.markdown(rows) in guide, "regenerate the table: python -m dit.sizing"
