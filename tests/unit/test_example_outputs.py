"""The examples' image names carry every setting that changes the image (runs with other
settings do not overwrite each other), as docs/examples.md shows them."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _shared():
    spec = importlib.util.spec_from_file_location("_shared", ROOT / "examples" / "_shared.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(**kw):
    base = dict(width=128, height=128, num_inference_steps=8, seed=42)
    return argparse.Namespace(**{**base, **kw})


def test_settings_that_change_the_image_change_the_name():
    changes = ({}, {"num_inference_steps": 20}, {"seed": 1}, {"width": 256}, {"height": 64})
    names = {_shared().run_settings(_args(**kw)) for kw in changes}
    assert len(names) == 5, names


def test_docs_show_the_name_the_example_writes():
    text = (ROOT / "docs" / "examples.md").read_text()
    shown = re.search(r"image saved to results/(\S+\.png)", text).group(1)
    settings = _shared().run_settings(_args())
    assert shown == f"pixart_alpha_random_tiny_cfg1_ulysses1_ring2_token_ring_{settings}_0.png"
    steps = re.search(r"total time: [\d.]+ s for (\d+) steps", text).group(1)
    assert f"_{steps}steps_" in shown  # the output shown is of one run
