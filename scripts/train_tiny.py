"""Trains the tiny default model and writes dit/tiny/model/ (the weights the `tiny` model name loads):

    .venv/bin/python scripts/train_tiny.py [--work /tmp/ithaca-tiny-train] [--seed 0] [--scale 1.0]

Deterministic from --seed and resumable: run it again with the same --work after a stop and it continues
from its last checkpoint. Everything it does is in dit/tiny/train.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dit.tiny.train import main  # noqa: E402

if __name__ == "__main__":
    main()
