"""Images of `tokenring-xdit compare`: metrics, PNG files, the amplified difference map and the
side-by-side figure.

Images are float arrays (H, W, 3) in [0, 1], as a pipeline returns them with output_type "pt"
(converted to numpy). Metrics are computed on these floats (scikit-image), before the 8-bit
rounding of the PNG files, so differences far below 1/255 still show. numpy, Pillow and
scikit-image load on first use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "Panel",
    "auto_gain",
    "diff_map",
    "image_metrics",
    "save_png",
    "side_by_side",
    "to_uint8",
]


def to_uint8(image):
    """(H, W, 3) floats in [0, 1] -> uint8, rounded (what a PNG file holds)."""
    import numpy as np

    return (np.clip(np.asarray(image, dtype=np.float64), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def save_png(image, path) -> None:
    from PIL import Image

    Image.fromarray(to_uint8(image), mode="RGB").save(path)


def image_metrics(test, reference) -> dict:
    """PSNR (dB; inf when identical), SSIM, max and mean |test - reference|, on [0, 1] floats.

    SSIM is scikit-image's (7x7 uniform window, or the largest odd window that fits a small
    image; channels averaged).
    """
    import numpy as np
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    a = np.asarray(test, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images differ in shape: {a.shape} vs {b.shape}")
    diff = np.abs(a - b)
    max_diff = float(diff.max())
    if max_diff == 0.0:
        psnr = math.inf  # skimage divides by zero (and warns) here
    else:
        psnr = float(peak_signal_noise_ratio(b, a, data_range=1.0))
    side = min(a.shape[0], a.shape[1])
    win = min(7, side if side % 2 else side - 1)
    ssim = float(structural_similarity(b, a, data_range=1.0, channel_axis=-1, win_size=win))
    return dict(psnr_db=psnr, ssim=ssim, max_abs_diff=max_diff, mean_abs_diff=float(diff.mean()))


def auto_gain(max_diff: float) -> float:
    """The power of ten that brings the largest difference into (0.1, 1]: 1 when there is none."""
    if max_diff <= 0.0 or not math.isfinite(max_diff):
        return 1.0
    return 10.0 ** math.floor(math.log10(1.0 / max_diff))


def diff_map(a, b, gain: float):
    """|a - b| * gain (channel maximum, clipped to 1) as an RGB heat map: black, red, yellow,
    white; (H, W, 3) floats in [0, 1]."""
    import numpy as np

    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max(axis=-1)
    x = np.clip(d * gain, 0.0, 1.0)
    return np.stack([np.clip(3 * x, 0, 1), np.clip(3 * x - 1, 0, 1), np.clip(3 * x - 2, 0, 1)], -1)


@dataclass
class Panel:
    """One image of the figure, with a bold title and lines of text under it."""

    image: object  # (H, W, 3) floats in [0, 1]
    title: str
    lines: list[str] = field(default_factory=list)


def side_by_side(
    panels: Sequence[Panel],
    *,
    heading: str = "",
    footer: Sequence[str] = (),
    min_side: int = 256,
    pad: int = 12,
    font_size: int = 14,
):
    """One PIL image: the panels in a row (enlarged, nearest neighbour, to at least `min_side`
    pixels), each captioned, with a heading above and footer lines below."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=font_size)
    bold = ImageFont.load_default(size=font_size + 2)
    h0, w0 = panels[0].image.shape[:2]
    scale = max(1, math.ceil(min_side / max(h0, w0)))
    h, w = h0 * scale, w0 * scale
    line = font_size + 4
    caption = (1 + max(len(p.lines) for p in panels)) * line + pad // 2
    top = (line + pad) if heading else pad
    bottom = len(footer) * line + (pad if footer else 0)
    width = pad + len(panels) * (w + pad)
    height = top + h + caption + bottom + pad
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    if heading:
        draw.text((pad, pad // 2), heading, fill="black", font=bold)
    for i, panel in enumerate(panels):
        x = pad + i * (w + pad)
        tile = Image.fromarray(to_uint8(panel.image), mode="RGB")
        canvas.paste(tile.resize((w, h), Image.NEAREST), (x, top))
        y = top + h + pad // 2
        draw.text((x, y), panel.title, fill="black", font=bold)
        for j, text in enumerate(panel.lines):
            draw.text((x, y + (j + 1) * line), text, fill=(60, 60, 60), font=font)
    y = top + h + caption
    for j, text in enumerate(footer):
        draw.text((pad, y + j * line), text, fill=(60, 60, 60), font=font)
    return canvas
