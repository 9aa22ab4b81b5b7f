"""Config mistakes whose cause is how Snakemake merges config: each message says the cause and the fix.

* an overlay switching a model's source form (hub -> local) merges into a source with keys of both forms;
* ``--config`` passes nested values as strings (``scoring='{workers: 3}'`` -> ``'3'``);
* a YAML syntax error in a config file names the file, line and column (Snakemake's own message does not).
"""

import copy
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from snakemake.cli import parse_config
from snakemake.common.configfile import load_configfile
from snakemake.utils import update_config

from _e2e import checkout_copy
from repro.config import REPO_ROOT, ConfigError, load_config, validate_config, yaml_syntax_error

RAW = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())


def merged(*layers):
    """config.yaml with each layer merged the way Snakemake merges --configfile files and --config."""
    cfg = copy.deepcopy(RAW)
    for layer in layers:
        update_config(cfg, layer)
    return cfg


def error(cfg, source):
    with pytest.raises(ConfigError) as e:
        validate_config(cfg, source=source)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# --- 3. an overlay pointing a hub model at a local checkpoint ----------------------------------------------

LOCAL = {"models": {"llada": {"source": {"type": "local", "path": "/data/ckpt"}}}}


def test_overlay_switching_source_form_names_both_forms_and_the_fix():
    msg = error(merged(LOCAL), "config.yaml + ov.yaml")
    assert "models.llada.source mixes keys of the hub form (repo_id, revision) and the local form (path)" in msg
    assert "merges nested keys into config.yaml's" in msg
    assert "bash scripts/main_table.sh llada /data/ckpt" in msg
    # the suggested model entry is the base model's role and decoder with the local source, and it validates
    m = re.search(r"e\.g\. (models: \{.*\}\}\}), and use it in the suite \((suites: \{.*\}\})\)", msg)
    assert m, msg
    fix = {**yaml.safe_load(m.group(1)), **yaml.safe_load(m.group(2))}
    entry = fix["models"]["llada-local"]
    assert entry["source"] == {"type": "local", "path": "/data/ckpt"}
    assert (entry["role"], entry["decoder"]) == ("base", "llada")
    cfg = validate_config(merged(fix))
    assert cfg["suites"][cfg["suite"]]["models"] == ["llada-local"]


def test_mixed_forms_without_overlay_and_other_forms():
    cfg = merged({"models": {"tiny": {"source": {"repo_id": "x/y", "revision": "main"}}}})  # tiny + hub keys
    msg = error(cfg, "config.yaml")
    assert "models.tiny.source mixes keys of the hub form (repo_id, revision) and the tiny form (seed)" in msg
    assert "overlay" not in msg and "define a new model name" in msg and "main_table.sh" not in msg


def test_single_form_errors_say_what_the_form_lacks():
    cfg = merged({"models": {"llada": {"source": {"type": "local"}}}})
    cfg["models"]["llada"]["source"] = {"type": "local"}
    msg = error(cfg, "config.yaml")
    assert "matches no source form ('path' is a required property)" in msg and "{type: local, path}" in msg


def test_snakemake_overlay_to_local_checkpoint(tmp_path):
    ov = tmp_path / "ov.yaml"
    ov.write_text(yaml.safe_dump(LOCAL))
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "main_table", "--configfile", "config.yaml", str(ov)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert ("Config error: config.yaml + ov.yaml: models.llada.source mixes keys of the hub form (repo_id, revision) "
            "and the local form (path)") in r.stderr


# --- 4. nested values through --config arrive as strings ---------------------------------------------------

@pytest.mark.parametrize("arg, where", [
    ("scoring={workers: 3}", "scoring.workers must be integer, got '3'"),
    ("scoring={timeout_s: 2.5}", "scoring.timeout_s must be number, got '2.5'"),
    ("containers={enabled: true}", "containers.enabled must be boolean, got 'true'"),
    ("suites={smoke: {limit: 5}}", "suites.smoke.limit must be integer or null, got '5'"),
    ("suites={smoke: {seeds: [7]}}", "suites.smoke.seeds[0] must be integer, got '7'"),
])
def test_nested_config_string_says_use_an_overlay(arg, where):
    msg = error(merged(parse_config([arg])), "config.yaml + --config")  # exactly what Snakemake's CLI builds
    assert where in msg
    assert "--config passes nested values as strings" in msg and "--configfile config.yaml overlay.yaml" in msg


def test_string_hint_only_when_the_string_would_parse_and_the_key_is_nested():
    assert "overlay" not in error(merged({"scoring": {"workers": "three"}}), "config.yaml + --config")
    quoted = error(merged({"scoring": {"workers": "3"}}), "config.yaml")  # quoted in a YAML file
    assert "write it without quotes" in quoted and "--config" not in quoted
    assert "overlay" not in error(merged({"suite": 3}), "config.yaml + --config")  # top level: not nested


def test_nested_string_in_a_tiny_source():
    msg = error(merged(parse_config(["models={tiny: {source: {seed: 1}}}"])), "config.yaml + --config")
    assert "models.tiny.source.seed must be integer, got '1'" in msg and "overlay file" in msg


# --- 5. YAML syntax errors: file, line, column ---------------------------------------------------------------

def broken(tmp_path, old, new, name="config.yaml"):
    text = (REPO_ROOT / "config.yaml").read_text()
    assert old in text
    p = tmp_path / name
    p.write_text(text.replace(old, new, 1))
    with pytest.raises(Exception, match="not valid JSON or YAML"):
        load_configfile(str(p))  # Snakemake's own message: no line
    return p, text.splitlines().index(next(l for l in text.splitlines() if old in l)) + 1


def test_unclosed_bracket_and_missing_colon_name_line_and_column(tmp_path):
    p, line = broken(tmp_path, SMOKE_MODELS, SMOKE_MODELS[:-1])
    msg = yaml_syntax_error(p)
    assert msg.startswith(f"{p}, line {line}, column 13: not valid YAML: while parsing a flow sequence")
    assert f"{SMOKE_MODELS[:-1]}'" in msg
    p, line = broken(tmp_path, "backend: engine", "backend engine")
    assert yaml_syntax_error(p).startswith(f"{p}, line {line}, column 1: not valid YAML") and "expected ':'" in \
        yaml_syntax_error(p)
    with pytest.raises(ConfigError, match=rf"line {line}, column 1"):
        load_config(p)
    tab = tmp_path / "tab.yaml"
    tab.write_text("scoring:\n\tworkers: 2\n")
    assert "line 2, column 1" in yaml_syntax_error(tab) and "spaces, not tabs" in yaml_syntax_error(tab)
    assert yaml_syntax_error(REPO_ROOT / "config.yaml") is None and yaml_syntax_error(tmp_path / "none") is None


@pytest.fixture
def checkout(tmp_path):
    """A checkout whose config.yaml can be broken: Snakefile and scripts copied, the rest linked."""
    root = checkout_copy(tmp_path, link=("repro", "workflow", ".venv"), copy=("Snakefile", "scripts"))
    (root / "config.yaml").write_text((REPO_ROOT / "config.yaml").read_text().replace(SMOKE_MODELS,
                                                                                       SMOKE_MODELS[:-1], 1))
    return root


# the smoke suite's model list, broken (closing bracket dropped) by the tests below, and its line
SMOKE_MODELS = next(l.strip() for l in (REPO_ROOT / "config.yaml").read_text().split("\nsuites:", 1)[1].split("\n  smoke:", 1)[1].splitlines()
                    if l.strip().startswith("models: ["))  # the smoke suite's models line
SMOKE_MODELS_LINE = next(i for i, l in enumerate((REPO_ROOT / "config.yaml").read_text().splitlines(), 1)
                         if SMOKE_MODELS in l)


def test_snakefile_reports_the_line_of_config_yaml(checkout):
    r = subprocess.run([sys.executable, "-m", "snakemake", "-n", "main_table"], cwd=checkout,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"Config error: {checkout / 'config.yaml'}, line {SMOKE_MODELS_LINE}, column 13: not valid YAML" in r.stderr, \
        r.stderr[-2000:]


def test_scripts_report_the_line_of_every_config_file(checkout, tmp_path):
    env = dict(os.environ, ORL_EVAL_WORK=str(tmp_path / "work"))
    r = subprocess.run(["bash", str(checkout / "scripts/main_table.sh"), "tiny", str(tmp_path), "-n"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"Config error: config.yaml, line {SMOKE_MODELS_LINE}, column 13: not valid YAML" in r.stderr
    assert "Traceback" not in r.stderr
    # an overlay given to a script: checked before Snakemake reads it
    shutil.copy(REPO_ROOT / "config.yaml", checkout / "config.yaml")
    ov = tmp_path / "ov.yaml"
    ov.write_text("suites:\n  smoke:\n    limit 2\n    shards: 1\n")
    r = subprocess.run(["bash", str(checkout / "scripts/prepare.sh"), "smoke", "-n", "--configfile", "config.yaml",
                        str(ov)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"Config error: {ov}, line 4, column 11: not valid YAML" in r.stderr, r.stderr
    assert "line 3 ('limit 2') has no ':' (a missing colon?)" in r.stderr
    assert "+ " not in r.stderr  # stopped before calling Snakemake


def test_block_mapping_error_names_the_failing_line_first(tmp_path):
    """A mis-indented key deep in the file: the line to fix comes first, not the line where the enclosing
    mapping starts (line 5 of config.yaml)."""
    text = (REPO_ROOT / "config.yaml").read_text().splitlines()
    at = text.index("scoring:") + 2  # after `workers:`
    text.insert(at, "   timeout: 3")
    p = tmp_path / "config.yaml"
    p.write_text("\n".join(text) + "\n")
    msg = yaml_syntax_error(p)
    assert msg.startswith(f"{p}, line {at + 1}, column 4: not valid YAML"), msg
    assert "'   timeout: 3'" in msg and "indentation" in msg, msg


def test_check_yaml_cli_names_the_line_of_an_overlay_snakemake_reads_itself(tmp_path):
    """`--configfile` files are read by Snakemake before the workflow (its message has no line): the README
    points at `python -m repro.config check-yaml`, which names file and line; exit 65 only on an error."""
    bad = tmp_path / "my.yaml"
    bad.write_text("suites:\n  smoke:\n    limit 2\n    shards: 1\n")
    r = subprocess.run([sys.executable, "-m", "repro.config", "check-yaml", str(REPO_ROOT / "config.yaml"), str(bad)],
                       capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert r.returncode == 65 and r.stderr.count("Config error:") == 1, r.stderr
    assert f"Config error: {bad}, line 4, column 11: not valid YAML" in r.stderr
    gone = subprocess.run([sys.executable, "-m", "repro.config", "check-yaml", str(tmp_path / "typo.yaml")],
                          capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)  # Snakemake: a 25-line traceback
    assert gone.returncode == 65 and gone.stderr.strip().splitlines() == [
        f"Config error: {tmp_path / 'typo.yaml'}: no such file; give the path of an existing config overlay"]
    none = subprocess.run([sys.executable, "-m", "repro.config", "check-yaml"], capture_output=True, text=True,
                          timeout=60, cwd=REPO_ROOT)  # it once checked nothing and said nothing (exit 0)
    assert none.returncode == 2 and "required: FILE" in none.stderr
    ok = subprocess.run([sys.executable, "-m", "repro.config", "check-yaml", str(REPO_ROOT / "config.yaml")],
                        capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert ok.returncode == 0 and ok.stderr == ""


# --- a suite's or a model's key given at the top level; a bound written as a riddle ---------------------------


def test_a_suite_key_at_top_level_says_where_it_goes():
    """The fresh user's `--config limit=2`: the error named the top level's keys and not suites.<suite>.limit."""
    cfg = merged(parse_config(["limit=2"]))
    msg = error(cfg, "config.yaml + --config")
    assert msg.startswith("config.yaml + --config: unknown key 'limit' in top level; allowed: ")
    assert (f"'limit' is a key of each entry of suites: set suites.{RAW['suite']}.limit in an overlay file "
            f"(--configfile config.yaml overlay.yaml, the overlay holding 'suites: {{{RAW['suite']}: {{limit: 2}}}}')"
            ", as --config cannot pass nested values") in msg, msg
    overlay = yaml.safe_load(re.search(r"the overlay holding '(.*?)'\)", msg).group(1))
    assert validate_config(merged(overlay))["suites"][RAW["suite"]]["limit"] == 2  # the advice works
    msg = error(merged({"quantization": "nvfp4"}), "config.yaml + ov.yaml")
    assert "set models.MODEL.quantization in an overlay file" in msg and "--config cannot" not in msg, msg
    assert "is a key of each entry" not in error(merged({"limitt": 2}), "config.yaml")  # no guess for a typo


@pytest.mark.parametrize("layer, says", [
    ({"scoring": {"timeout_s": 0}}, "config.yaml + ov.yaml: scoring.timeout_s must be > 0, got 0"),
    ({"scoring": {"workers": 0}}, "config.yaml + ov.yaml: scoring.workers must be >= 1, got 0"),
])
def test_a_bound_says_the_bound_and_the_value(layer, says):
    assert error(merged(layer), "config.yaml + ov.yaml") == says


def test_a_misspelt_decoder_or_decoder_suite_stops_at_start_up():
    """The fresh user's `decoder: llada-orll` passed the dry run and failed inside render_decoder jobs, naming
    the checkpoint's paper_decoding.json instead of config.yaml's key."""
    model = next(m for m, e in RAW["models"].items() if e.get("decoder") == "llada-orl")
    msg = error(merged({"models": {model: {"decoder": "llada-orll"}}}), "config.yaml + ov.yaml")
    assert msg == (f"config.yaml + ov.yaml: models.{model}.decoder = 'llada-orll' is not a decoder model of "
                   "repro/paper/paper_decoding.json; did you mean 'llada-orl'? (allowed there: llada, llada-orl)")
    msg = error(merged({"suites": {RAW["suite"]: {"decoder_suite": "mian"}}}), "config.yaml")
    assert msg.startswith(f"config.yaml: suites.{RAW['suite']}.decoder_suite = 'mian' is not a suite of "
                          "repro/paper/paper_decoding.json; did you mean 'main'?"), msg
    # a name far from every packaged one may come from the checkpoint's own copy: left to the decoder job
    validate_config(merged({"models": {model: {"decoder": "my-own-decoder"}}}))


def test_a_close_decoder_name_that_the_local_checkpoint_defines_is_accepted(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    pd = __import__("json").loads((REPO_ROOT / "repro/paper/paper_decoding.json").read_text())
    pd["suites"]["main"]["llada-orl2"] = pd["suites"]["main"]["llada-orl"]
    (ckpt / "paper_decoding.json").write_text(__import__("json").dumps(pd))
    layer = {"models": {"mine": {"label": "mine", "role": "orl", "decoder": "llada-orl2",
                                 "source": {"type": "local", "path": str(ckpt)}}}}
    assert validate_config(merged(layer))["models"]["mine"]["decoder"] == "llada-orl2"
    (ckpt / "paper_decoding.json").unlink()
    assert "did you mean 'llada-orl'?" in error(merged(layer), "config.yaml")
