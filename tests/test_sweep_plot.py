"""The sweep figure (repro.tables.plot): nothing drawn is cut off at the image's edges, also for a one-point,
one-benchmark sweep (the README's way to change the thresholds for one run), whose single panel is narrow."""

import matplotlib.image
import numpy as np
import pandas as pd

from repro.tables.plot import plot_sweep


def test_one_panel_sweep_keeps_its_legend_inside_the_image(tmp_path):
    label = "+ ORL (tiny, random weights)"
    rows = [("smoke", True, 0.85, 0.5, 0.0, 0.58), ("smoke-sweep-t0p7-e0p3", False, 0.7, 0.3, 0.0, 0.72)]
    df = pd.DataFrame([{"model": "tiny-orl", "label": label, "benchmark": "gsm8k", "point": p, "paper_setting": ps,
                        "threshold": t, "edit_threshold": e, "accuracy": acc, "tpf": tpf, "n": 3}
                       for p, ps, t, e, acc, tpf in rows])
    spec = {"benchmarks": ["gsm8k"], "models": [{"name": "tiny-orl", "label": label}],
            "points": [{"overrides": {"threshold": 0.7, "edit_threshold": 0.3}}]}
    png, pdf = tmp_path / "sweep.png", tmp_path / "sweep.pdf"
    plot_sweep(df, spec, png, pdf)
    img = matplotlib.image.imread(png)[..., :3]
    ink = (img < 0.9).any(axis=2)  # any pixel that is not (near) white
    # the legend sits below the panel: its text must not run into the image's left or right edge
    assert not ink[:, :3].any() and not ink[:, -3:].any(), "something is cut off at the image's side"
    assert pdf.stat().st_size > 0
