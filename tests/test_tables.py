"""Table rendering: paper layout, half-up rounding on displayed values, LaTeX escaping, missing cells."""

import pandas as pd

from repro.tables.render import fmt, latex_escape, to_csv, to_latex, to_markdown, wide

BENCH = ["gsm8k", "math500"]


def long_frame():
    return pd.DataFrame([
        {"model": "a_b", "label": "LLaDA_2.1 & co", "benchmark": "gsm8k", "seed": 1, "accuracy": 62.25, "tpf": 5.55},
        {"model": "a_b", "label": "LLaDA_2.1 & co", "benchmark": "gsm8k", "seed": 2, "accuracy": 62.25, "tpf": 5.55},
        {"model": "a_b", "label": "LLaDA_2.1 & co", "benchmark": "math500", "seed": 1, "accuracy": 80.0, "tpf": None},
        {"model": "orl", "label": "+ ORL", "benchmark": "gsm8k", "seed": 1, "accuracy": 92.0, "tpf": 8.5},
        {"model": "orl", "label": "+ ORL", "benchmark": "math500", "seed": 1, "accuracy": 87.04, "tpf": 10.2},
    ])


def test_half_up_rounding():
    assert fmt(62.25) == "62.3" and fmt(71.35) == "71.4" and fmt(None) == "-" and fmt(float("nan")) == "-"


def test_markdown_layout_and_order():
    md = to_markdown(wide(long_frame(), BENCH), BENCH)
    lines = md.splitlines()
    assert lines[0] == "| Model | GSM8K Acc | GSM8K TPF | MATH-500 Acc | MATH-500 TPF |"
    assert lines[2] == "| LLaDA_2.1 & co | 62.3 | 5.6 | 80.0 | - |"
    assert lines[3] == "| + ORL | 92.0 | 8.5 | 87.0 | 10.2 |"


def test_latex_is_booktabs_and_escaped():
    tex = to_latex(wide(long_frame(), BENCH), BENCH, "Acc & TPF", "tab:x")
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex and "|" not in tex
    assert r"LLaDA\_2.1 \& co" in tex and r"\cmidrule(lr){2-3}" in tex and "--" in tex
    assert latex_escape("50%_$#") == r"50\%\_\$\#"


def test_csv_keeps_machine_names():
    csv = to_csv(wide(long_frame(), BENCH), BENCH).splitlines()
    assert csv[0] == "model,label,gsm8k_acc,gsm8k_tpf,math500_acc,math500_tpf"
    assert csv[1] == 'a_b,LLaDA_2.1 & co,62.3,5.6,80.0,'
