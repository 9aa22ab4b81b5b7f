"""Reading results as a paper does, on the real benchmark files: the replay backend (the benchmarks' own
reference solutions score 100 % through the scoring stage; bad samples files are refused by name),
`python -m repro.tables compare` (per-problem differences, McNemar's exact test, TPF on both-solved,
"no differences", refusal of different problem sets) and the reported-numbers reference rows."""

import json
import subprocess
import sys

import pytest

from repro import paths
from repro.backends.replay import ReplayError, reference_completion, replay
from repro.scoring import score_records, summarize
from repro.tables.aggregate import cell_tpf, collect
from repro.tables.compare import CompareError, compare, mcnemar_exact, parse_run, to_markdown
from repro.tables.reference import compare_reported, load_reported

N = 6
SEED = 12345


def prepare(work, suite, data_dir, bench="gsm8k", limit=N, builtin=False):
    out = work / paths.PROBLEMS.format(suite=suite, bench=bench)
    src = ["--no-builtin", "--data-dir", str(data_dir)] if not builtin else ["--no-hub"]
    r = subprocess.run([sys.executable, "-m", "repro.data.prepare", "--benchmark", bench, "--out", str(out),
                        "--limit", str(limit), *src], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(l) for l in out.read_text().splitlines()]


def run_cell(work, suite, model, bench, samples, problems):
    """Replay ``samples`` (path or 'reference') as one cell and score it, as the workflow's rules do."""
    fmt = dict(suite=suite, model=model, bench=bench, seed=SEED)
    gen = work / paths.GENERATIONS.format(**fmt)
    replay(str(samples), work / paths.PROBLEMS.format(suite=suite, bench=bench), bench, model, SEED, gen)
    recs = [json.loads(l) for l in gen.read_text().splitlines()]
    scores = score_records(bench, problems, {r["id"]: r["completion"] for r in recs}, workers=1)
    (work / paths.SCORES.format(**fmt)).parent.mkdir(parents=True, exist_ok=True)
    (work / paths.SCORES.format(**fmt)).write_text("".join(json.dumps(s) + "\n" for s in scores))
    (work / paths.SUMMARY.format(**fmt)).write_text(json.dumps(summarize(bench, scores)))
    return gen


@pytest.fixture
def runs(tmp_path, data_dir):
    """Work dir with suite `s`: `gold` replays GSM8K's reference solutions; `edited` the same with two answers
    made wrong and forward counts; `other` is `edited` again (identical)."""
    work = tmp_path / "work"
    probs = prepare(work, "s", data_dir)
    run_cell(work, "s", "gold", "gsm8k", "reference", probs)
    samples = tmp_path / "edited.jsonl"
    lines = []
    for i, p in enumerate(probs):
        text = reference_completion("gsm8k", p)
        if i in (1, 4):
            text = text.rsplit("####", 1)[0] + "#### 999999"
        lines.append({"id": p["id"], "completion": text, "generated_tokens": 40 + i,
                      "forwards": {"prefill": 1, "denoise": 8, "commit": 2}})
    lines.append({"id": "HumanEval/0", "benchmark": "humaneval", "completion": "x"})  # another benchmark: skipped
    samples.write_text("".join(json.dumps(r) + "\n" for r in lines))
    for model in ("edited", "other"):
        run_cell(work, "s", model, "gsm8k", samples, probs)
    return work, probs


@pytest.mark.parametrize("bench", ["gsm8k", "math500", "humaneval", "mbpp"])
def test_reference_solutions_replayed_score_100_through_the_scoring_stage(tmp_path, data_dir, bench):
    work = tmp_path / "work"
    prepare(work, "s", data_dir, bench, limit=8)
    fmt = dict(suite="s", model="reference", bench=bench, seed=SEED)
    gen, problems = work / paths.GENERATIONS.format(**fmt), work / paths.PROBLEMS.format(suite="s", bench=bench)
    r = subprocess.run([sys.executable, "-m", "repro.backends.replay", "--samples", "reference", "--problems",
                        str(problems), "--benchmark", bench, "--model", "reference", "--seed", str(SEED), "--out",
                        str(gen)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    meta = json.loads((gen.parent / (gen.name + ".meta.json")).read_text())
    assert meta["backend"] == "replay" and meta["samples"]["kind"] == "reference" and meta["records_used"] == 8
    summ = work / "summary.json"
    r = subprocess.run([sys.executable, "-m", "repro.scoring", "score", "--benchmark", bench, "--problems",
                        str(problems), "--generations", str(gen), "--out", str(work / "scores.jsonl"), "--summary",
                        str(summ), "--workers", "2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(summ.read_text())["accuracy"] == 100.0, (work / "scores.jsonl").read_text()[:2000]
    assert cell_tpf(gen) == (None, None, None)  # no forward counts: no TPF (empty cells, not 0)


def test_replay_forward_counts_give_tpf_and_bad_samples_are_refused_by_name(runs, tmp_path):
    work, probs = runs
    gen = work / paths.GENERATIONS.format(suite="s", model="edited", bench="gsm8k", seed=SEED)
    tokens = sum(40 + i for i in range(N))
    assert cell_tpf(gen) == (tokens / (10 * N), tokens, 10 * N)
    assert json.loads((gen.parent / (gen.name + ".meta.json")).read_text())["records_ignored"] == 1
    problems = work / paths.PROBLEMS.format(suite="s", bench="gsm8k")
    bad = tmp_path / "bad.jsonl"
    cases = [
        ([{"id": p["id"], "completion": "1"} for p in probs[:-1]], f"no gsm8k sample for 1 of the suite's {N} problems, e.g. \\['{probs[-1]['id']}'\\]"),
        ([{"id": probs[0]["id"], "completion": "1"}] * 2, "a second record for id"),
        ([{"id": p["id"], "completion": "1", "forwards": {"denoise": 3, "commit": 1}} for p in probs],
         "forward counts need 'generated_tokens'"),
        ([{"id": p["id"], "completion": "1", "generated_tokens": 3, "forwards": 4} for p in probs],
         "'forwards' must be an object with integer 'denoise' and 'commit'"),
        ([{"id": probs[0]["id"], "completion": None}], "has no string 'completion'"),
    ]
    for recs, msg in cases:
        bad.write_text("".join(json.dumps(r) + "\n" for r in recs))
        with pytest.raises(ReplayError, match=msg):
            replay(str(bad), problems, "gsm8k", "m", SEED, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()  # nothing written on a refusal


def test_compare_lists_changed_problems_with_mcnemar_and_tpf_on_both_solved(runs, tmp_path):
    work, probs = runs
    res = compare(parse_run("s/gold", work), parse_run("s/edited", work))
    (g,) = res["benchmarks"]
    assert g["only_a"] == [probs[1]["id"], probs[4]["id"]] and g["only_b"] == []
    assert g["mcnemar_p"] == pytest.approx(0.5) and g["both_solved"] == N - 2
    assert g["acc_a"] == 100.0 and g["delta"] == pytest.approx(-200 / N)
    assert g["tpf_a_both"] is None  # the reference replay has no forward counts
    both = [40 + i for i in range(N) if i not in (1, 4)]
    assert g["tpf_b_both"] == pytest.approx(sum(both) / (10 * len(both)))
    md = to_markdown(res)
    assert f"solved by A only (2): {probs[1]['id']}, {probs[4]['id']}" in md and "| 0.5 |" in md
    same = compare(parse_run(f"{work}/s/edited", work), parse_run("s/other", work))
    assert same["no_differences"] and "**No differences**" in to_markdown(same)
    # the CLI: Markdown on stdout, four files with --out
    r = subprocess.run([sys.executable, "-m", "repro.tables", "compare", f"{work}/s/gold", f"{work}/s/edited", "--out",
                        str(tmp_path / "cmp")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "McNemar" in r.stdout, r.stderr
    assert all((tmp_path / f"cmp{s}").exists() for s in (".md", ".json", ".csv", "_problems.csv"))
    assert sum("True" in l.split(",")[6] for l in (tmp_path / "cmp_problems.csv").read_text().splitlines()[1:]) == 2


def test_compare_refuses_different_problem_sets_naming_the_difference(runs, tmp_path, data_dir):
    work, probs = runs
    other = tmp_path / "work2"
    fewer = prepare(other, "s", data_dir, limit=N - 1)
    run_cell(other, "s", "gold", "gsm8k", "reference", fewer)
    with pytest.raises(CompareError, match=rf"GSM8K: the runs scored different problem sets: 1 only in A \({probs[-1]['id']}\)"):
        compare(parse_run("s/gold", work), parse_run(f"{other}/s/gold", work))
    shipped = tmp_path / "work3"  # the shipped problems reuse the ids gsm8k/0.. for other questions
    own = prepare(shipped, "s", data_dir, limit=N, builtin=True)
    run_cell(shipped, "s", "gold", "gsm8k", "reference", own)
    with pytest.raises(CompareError, match="with the same id but a different problem record"):
        compare(parse_run("s/gold", work), parse_run(f"{shipped}/s/gold", work))
    with pytest.raises(CompareError, match="no scores for model 'nope'.*models scored there: edited, gold, other"):
        parse_run("s/nope", work)
    r = subprocess.run([sys.executable, "-m", "repro.tables", "compare", f"{work}/s/gold", f"{other}/s/gold"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "different problem sets" in r.stderr and "Traceback" not in r.stderr


def test_mcnemar_exact_is_the_two_sided_binomial_test():
    stats = pytest.importorskip("scipy.stats")
    for a, b in [(0, 0), (2, 0), (0, 5), (3, 3), (1, 9), (12, 30)]:
        want = 1.0 if a + b == 0 else stats.binomtest(b, a + b, 0.5).pvalue
        assert mcnemar_exact(a, b) == pytest.approx(want)


def test_reference_rows_show_reported_ours_difference_and_interval_with_citation(runs, tmp_path):
    work, _ = runs
    src = load_reported()[0]
    assert src["url"].startswith("https://") and src["date_read"] and "Table 1" in src["table"]
    models = [{"name": "gold", "label": "gold replay", "repo_id": "inclusionAI/LLaDA2.1-mini", "replay": True},
              {"name": "edited", "label": "edited replay", "repo_id": "yifanyu/LLaDA2.1-mini-ORL", "replay": True}]
    spec = {"models": models, "benchmarks": ["gsm8k"], "seeds": [SEED], "backend": "engine", "reported": True}
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "repro.tables", "--work", str(work), "--suite", "s", "--spec",
                        json.dumps(spec), "--out-dir", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    md, tex = (out / "main_table.md").read_text(), (out / "main_table.tex").read_text()
    # gold scores 100 with interval [100, 100]: the paper's 91.9 lies outside; edited scores 66.7 with a wide one
    assert "| LLaDA-2.1-mini (reported¹) | 91.9 | 5.6 |" in md
    assert "| Δ gold replay − reported | +8.1 (outside CI) | - |" in md
    long = collect(work, "s", models, ["gsm8k"], [SEED])
    edited = compare_reported(long, models, ["gsm8k"])[1]["cells"]["gsm8k"]
    assert edited["ci_lo"] <= 92.0 <= edited["ci_hi"] and edited["in_ci"] is True
    assert edited["diff_tpf"] == pytest.approx(edited["ours_tpf"] - 8.5)
    assert src["url"] in md and f"read {src['date_read']}" in md and "not measured here" in md
    assert r"\textit{LLaDA-2.1-mini (reported)} & 91.9 & 5.6 \\" in tex
    assert tex.index("(reported)") > tex.index(r"\midrule") and tex.index("(reported)") < tex.index(r"\bottomrule")
    assert "read 2026-11-30" in tex.split(r"\label")[0]  # the citation is in the caption
    assert "LLaDA-2.1-mini (reported)" in (out / "main_table.csv").read_text()
    rep = (out / "main_table_reported.csv").read_text().splitlines()
    assert rep[0].startswith("model,label,reported_label,benchmark,metric,ours,ci_lo,ci_hi,reported,diff,reported_in_ci")
    assert len(rep) == 1 + 2 * 2
    prov = json.loads((out / "provenance.json").read_text())
    assert prov["reported"]["sources"][0]["url"] == src["url"] and len(prov["reported"]["sha256"]) == 64
    assert prov["cells"][0]["samples"]["kind"] == "reference"
    # off: no reference rows, no citation
    spec["reported"] = False
    subprocess.run([sys.executable, "-m", "repro.tables", "--work", str(work), "--suite", "s", "--spec", json.dumps(spec),
                    "--out-dir", str(out)], check=True, capture_output=True, timeout=120)
    assert "reported" not in (out / "main_table.md").read_text().split("\n\n", 1)[1]
    assert "Row \u201cgold replay\u201d is replayed, not generated" in (out / "main_table.md").read_text()


def test_config_refuses_bad_replay_sweep_and_compare_settings_in_one_line():
    import copy

    import yaml

    from repro.config import REPO_ROOT, ConfigError, validate_config

    base = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    cases = [
        (("models", "x", {"label": "x", "source": {"type": "replay"}}), "'samples' is a required property"),
        (("models", "x", {"label": "x", "source": {"type": "tiny", "seed": 1}}), "'role' is missing in models.x"),
        (("sweep", "models", ["reference"]), "names 'reference', a replay model"),
        (("sweep", "threshold", [1.5]), "suites.smoke.sweep.threshold[0] must be <= 1, got 1.5"),
        (("sweep", "thresholds", [0.5]), "unknown key 'thresholds' in suites.smoke.sweep; allowed: benchmarks, "
                                         "edit_threshold, models, threshold"),
        (("compare", None, [["tiny", "nope"]]), "suites.smoke.compare names unknown model 'nope'"),
    ]
    for (where, key, value), msg in cases:
        cfg = copy.deepcopy(base)
        if where == "models":
            cfg["models"][key] = value
        elif where == "sweep":
            cfg["suites"]["smoke"]["sweep"][key] = value
        else:
            cfg["suites"]["smoke"]["compare"] = value
        with pytest.raises(ConfigError) as e:
            validate_config(cfg)
        assert msg in str(e.value) and "\n" not in str(e.value)


def test_replayed_reference_row_caption_names_every_rejected_solution():
    from repro.backends.replay import caption_note

    ok = caption_note("ref", {"kind": "reference"}, has_tpf=False)
    assert "Every reference solution is scored correct (100%)" in ok
    assert "no TPF (n/c: the samples carry no forward counts)" in ok  # the table's n/c cell, explained
    bad = caption_note("ref", {"kind": "reference"}, has_tpf=False, rejected=["gsm8k/3 (wrong: 7 != gold 8)"])
    assert "Exceptions, reference solutions the scorers reject (1): gsm8k/3 (wrong: 7 != gold 8)." in bad
    assert r"(100\%)" in caption_note("ref", {"kind": "reference"}, has_tpf=False, latex=True)


def test_compare_skips_benchmarks_one_run_lacks_naming_them(runs, tmp_path, data_dir):
    """The README's sweep point (GSM8K only) against the smoke run (GSM8K and HumanEval) compares GSM8K."""
    work, probs = runs
    he = prepare(work, "s", data_dir, bench="humaneval", limit=2)
    run_cell(work, "s", "gold", "humaneval", "reference", he)
    res = compare(parse_run("s/gold", work), parse_run("s/edited", work))
    assert [x["benchmark"] for x in res["benchmarks"]] == ["gsm8k"]
    assert res["skipped"] == {"only_a": ["humaneval"], "only_b": []}
    assert "Skipped (scored by run A only): HumanEval." in to_markdown(res)
    r = subprocess.run([sys.executable, "-m", "repro.tables", "compare", f"{work}/s/edited", f"{work}/s/gold"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Skipped (scored by run B only): HumanEval." in r.stdout, r.stderr
    with pytest.raises(CompareError, match="run B .* has no humaneval scores"):
        compare(parse_run("s/gold", work), parse_run("s/edited", work), ["gsm8k", "humaneval"])
    only_he = tmp_path / "work4"  # nothing in common: refused
    run_cell(only_he, "s", "gold", "humaneval", "reference", prepare(only_he, "s", data_dir, bench="humaneval", limit=2))
    with pytest.raises(CompareError, match="no benchmark in common: A gsm8k; B humaneval"):
        compare(parse_run("s/edited", work), parse_run(f"{only_he}/s/gold", work))
