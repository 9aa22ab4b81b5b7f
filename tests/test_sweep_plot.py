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


def test_operating_point_labels_stay_inside_their_panel(tmp_path):
    """A fresh user's sweep on real problems: the paper's operating point at the bottom right of the range got its
    label below and right of the star, on the x tick labels ("paper: τ=0.5, edit 0" over "0.8") and past the frame.
    The labels now point into the panel; both models' labels are checked in a two-panel sweep."""
    models = [("tiny", "tiny LLaDA2 (random weights)", 0.5, 0.0), ("tiny-orl", "+ ORL (tiny, random weights)", 0.85, 0.5)]
    rows = []
    for bench, accs in (("gsm8k", (0.0, 33.3, 0.0)), ("humaneval", (66.7, 0.0, 100.0))):
        for k, (name, label, t_op, e_op) in enumerate(models):
            for j, (t, tpf) in enumerate(((0.9, 0.48 + 0.04 * k), (0.7, 0.70), (t_op, 0.77 + 0.06 * k))):
                rows.append({"model": name, "label": label, "benchmark": bench, "point": "smoke" if t == t_op else
                             f"smoke-sweep-t{t}", "paper_setting": t == t_op, "threshold": t,
                             "edit_threshold": e_op, "accuracy": accs[j] if k == 0 else accs[(j + 1) % 3],
                             "tpf": tpf, "n": 3})
    spec = {"benchmarks": ["gsm8k", "humaneval"], "models": [{"name": n, "label": lb} for n, lb, _, _ in models],
            "points": [{"overrides": {"threshold": t}} for t in (0.9, 0.7)]}
    fig = plot_sweep(pd.DataFrame(rows), spec, tmp_path / "sweep.png", tmp_path / "sweep.pdf")
    r = fig._get_renderer()  # the canvas it was saved with
    seen = 0
    for ax in fig.axes:
        box = ax.get_window_extent(r)
        for a in ax.texts:
            if a.get_text().startswith("paper:"):
                e = a.get_window_extent(r)
                seen += 1
                assert box.x0 <= e.x0 and e.x1 <= box.x1 and box.y0 <= e.y0 and e.y1 <= box.y1, (a.get_text(), e, box)
    assert seen == 4  # one per model and panel
