"""The trained tiny default model: a visual language of coloured shapes moving on black (`language`), the
renderer that draws its clips (`render`), the detector that reads a video back into words (`detect`), and the
training that writes the shipped weights (`train`; run by `scripts/train_tiny.py`)."""
