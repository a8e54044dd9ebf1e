"""What a test of `atoll report` checks in the HTML: every plot drawn, none blank."""

from __future__ import annotations

import base64
import io
import re
from pathlib import Path

from atoll.report import STREAM_PLOTS

LOSS_PLOTS = ["eval loss against tokens", "eval loss against wall time"]


def plots_in(path: Path) -> dict[str, bytes]:
    text = path.read_text()
    found = re.findall(r'<img alt="([^"]*)" src="data:image/png;base64,([^"]*)"', text)
    return {alt: base64.b64decode(b64) for alt, b64 in found}


def assert_every_plot_drawn(path: Path, streams: int = 1) -> None:
    import matplotlib.image as mpimg

    text = path.read_text()
    assert "Not in this run" not in text, re.findall(r"Not in this run[^<]*", text)
    assert text.count("<img") == len(LOSS_PLOTS) + streams * len(STREAM_PLOTS)
    images = plots_in(path)
    assert set(images) == set(LOSS_PLOTS) | set(STREAM_PLOTS)
    for alt, png in images.items():
        pixels = mpimg.imread(io.BytesIO(png), format="png")
        flat = pixels.reshape(-1, pixels.shape[-1])
        # not one colour; and more than the axes' black and white: the data is drawn in colour
        colours = {tuple(p) for p in flat[:: max(len(flat) // 20000, 1)].round(2).tolist()}
        coloured = (abs(flat[:, 0] - flat[:, 1]) + abs(flat[:, 1] - flat[:, 2]) > 0.2).sum()
        assert len(colours) > 1, alt
        assert coloured > 30, f"{alt}: no coloured pixels (no data drawn)"
