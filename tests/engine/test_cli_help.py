"""`python -m repro.engine` help and usage: every option says what it is and its default, `bench --help` lists its
sub-benchmarks, a missing command names the choices, and a bad value prints the usage of the (sub)command whose
option it is (not the top-level usage)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import repro.engine.__main__ as M
from repro.config import REPO_ROOT


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        M.main([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _error(capsys, *argv) -> str:
    """stderr of a command line that argparse refuses (exit status 2)."""
    with pytest.raises(SystemExit) as e:
        M.main(list(argv))
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.fixture(autouse=True)
def _columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")  # argparse and the bench lists wrap to $COLUMNS - 2


def test_generate_threads_help_names_no_foreign_option(capsys):
    """`generate --threads` used to cite `--batch-size 8`, an option `generate` does not have."""
    out = _help(capsys, "generate")
    assert "--batch-size" not in out
    opts = out[out.index("options:"):]
    threads = opts[opts.index("--threads N"):opts.index("--raw")]
    assert "default: $OMP_NUM_THREADS if set, else 1" in " ".join(threads.split())
    assert "repro/engine/README.md" in threads


def test_every_option_has_help_with_its_default(capsys):
    import argparse

    from repro.engine.bench import COMMANDS, rounds

    _, subs = M.build_parser()
    for name, p in subs.items():
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert a.help, f"{name} {a.option_strings or a.dest}: no help"
            if a.option_strings and not a.required and a.dest not in ("raw", "decoder"):
                if name == "serve" and (a.default is None or a.default is False):  # serve's opt-in settings
                    continue
                assert "default" in a.help, f"{name} {a.option_strings}: help states no default"
    # the round benchmarks' options too (python -m repro.engine.bench MODE)
    for a in rounds.build_parser({n: what for n, (_, what) in COMMANDS.items()})._actions:
        if not isinstance(a, argparse._HelpAction):
            assert a.help, f"repro.engine.bench {a.option_strings or a.dest}: no help"
            if a.option_strings and a.default not in (None, False):
                assert "default" in a.help, f"repro.engine.bench {a.option_strings}: help states no default"
    for cmd in ("generate", "bench suite", "serve"):
        role = next(a for a in subs[cmd]._actions if a.dest == "role")
        assert (role.help % {"default": role.default}).endswith("(default: orl)")
    text = " ".join(_help(capsys, "bench", "suite").split())
    assert "--role {orl,base} orl: load the checkpoint's ORL residual adapter" in text and "(default: orl)" in text
    assert "--batch-size N requests decoded together, with continuous batching (default: 1, one at a time)" in text


def test_decoder_defaults_quote_the_packaged_paper_decoding(capsys):
    """The decoder flags' defaults are the roles' decoders of the packaged paper_decoding.json."""
    from repro.engine.llm import ROLES
    from repro.paper import DEFAULT_PAPER_DECODING

    assert M._ROLE_MODELS == ROLES
    main = json.loads(DEFAULT_PAPER_DECODING.read_text())["suites"]["main"]
    orl, base = main["llada-orl"]["defaults"], main["llada"]["defaults"]
    text = " ".join(_help(capsys, "generate").split())
    assert f"(default: {orl['threshold']} for --role orl, {base['threshold']} for base)" in text
    assert f"(default: {orl['edit_threshold']} for --role orl, {base['edit_threshold']} for base)" in text
    assert f"(default: {orl['algorithm']} for --role orl, {base['algorithm']} for base)" in text
    for words in ("mask threshold", "edit threshold", "denoising step", "tokens per block", "T2T",
                  "NFE", "TPF", "sampling seed, used when --temperature > 0 (default: the decoder's seed"):
        assert words in text, words
    suite = " ".join(_help(capsys, "bench", "suite").split())
    assert "(default: the --decoder file's seed, else 12345)" in suite and "NFE" in suite and "TPF" in suite


def test_bench_help_lists_its_sub_benchmarks(capsys):
    out = _help(capsys, "bench")
    assert "usage: python -m repro.engine bench [-h] SUB_BENCHMARK ..." in out
    desc = out[:out.index("options:")]
    assert "Sub-benchmarks:" in desc and "\n  suite  generation speed of a checkpoint on benchmark problem files" in desc
    assert "NFE" in desc and "TPF" in desc
    assert "python -m repro.engine.bench NAME [--help], NAME one of:" in " ".join(out.split())
    from repro.engine.bench import COMMANDS

    assert "\n  round, generate, decode, all, batch  one denoising round" in out
    for name, (module, _) in COMMANDS.items():  # the benchmarks it points to exist
        assert f"\n  {name} " in out and importlib.util.find_spec(f"repro.engine.bench.{module}") is not None, name
    assert max(map(len, out.splitlines())) <= 98, out  # wrapped to $COLUMNS - 2, as argparse's own text


def test_missing_command_names_the_choices(capsys):
    err = _error(capsys)
    assert "usage: python -m repro.engine [-h] COMMAND ..." in err
    assert "error: choose a command: generate, bench, serve ('python -m repro.engine --help' says what" in err
    assert "required" not in err and "cmd" not in err
    err = _error(capsys, "bench")
    assert err.startswith("usage: python -m repro.engine bench [-h] SUB_BENCHMARK ...")
    assert "error: choose a sub-benchmark: suite ('python -m repro.engine bench --help'" in err
    assert "bench_cmd" not in err and "required" not in err


@pytest.mark.parametrize("argv, says", [
    (["gen"], "error: argument COMMAND: invalid choice: 'gen' (choose from 'generate', 'bench', 'serve')"),
    (["bench", "sute"], "error: argument SUB_BENCHMARK: invalid choice: 'sute' (choose from 'suite')"),
])
def test_a_mistyped_command_names_the_choices_not_internal_names(capsys, argv, says):
    err = _error(capsys, *argv)
    assert says in err and "cmd" not in err, err


@pytest.mark.parametrize("argv, usage, says", [
    # the fresh user's words: argparse took 8 for the prompt and said only "unrecognized arguments"
    (["generate", "--model", "m", "--max_new_tokens", "8", "hi"], "generate",
     "--max_new_tokens: python -m repro.engine generate has no such option; did you mean --max-new-tokens?"),
    (["bench", "suite", "--model", "m", "--problems", "p.jsonl", "--out", "o", "--batch_size=4"], "bench suite",
     "--batch_size: python -m repro.engine bench suite has no such option; did you mean --batch-size?"),
    (["generate", "--model", "m", "--treshold", "0.9", "hi"], "generate", "did you mean --threshold?"),
    (["serve", "--model", "m", "--zzzz"], "serve", "no such option; 'python -m repro.engine serve --help' lists"),
])
def test_an_unknown_option_names_the_closest_one(capsys, argv, usage, says):
    err = _error(capsys, *argv)
    assert err.startswith(f"usage: python -m repro.engine {usage} [-h]"), err
    assert says in err.splitlines()[-1] and "unrecognized" not in err, err


def test_known_options_prefixes_and_values_after_double_dash_still_parse():
    from repro.engine.__main__ import parse_args

    a = parse_args(["generate", "--model", "m", "--max-new", "8", "--", "--max_new_tokens is my prompt"])
    assert a.max_new_tokens == 8 and a.prompt == "--max_new_tokens is my prompt"


def test_missing_command_from_the_shell():
    r = subprocess.run([sys.executable, "-m", "repro.engine"], cwd=REPO_ROOT, capture_output=True, text=True,
                       timeout=120, env={**os.environ, "COLUMNS": "100"})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines()[-1].startswith("python -m repro.engine: error: choose a command: generate, bench")


@pytest.mark.parametrize("argv,usage,message", [
    (["bench", "suite", "--model", "m", "--problems", "p.jsonl", "--out", "o", "--batch-size", "0"],
     "bench suite", "--batch-size 0: give N >= 1"),
    (["bench", "suite", "--model", "m", "--problems", "p.jsonl", "--out", "o", "--limit", "0"],
     "bench suite", "--limit 0: give N >= 1"),
    (["bench", "suite", "--model", "m", "--problems", "p.jsonl", "--out", "o", "--threads", "0"],
     "bench suite", "--threads 0: give N >= 1"),
    (["generate", "--model", "m", "--threads", "0", "hi"], "generate", "--threads 0: give N >= 1"),
    (["serve", "--model", "m", "--threads", "0"], "serve", "--threads 0: give N >= 1"),
])
def test_a_bad_value_prints_its_subcommand_usage(argv, usage, message, capsys):
    """`bench suite --batch-size 0` used to print the top-level usage above its error."""
    err = _error(capsys, *argv)
    assert err.startswith(f"usage: python -m repro.engine {usage} [-h] --model"), err
    assert f"python -m repro.engine {usage}: error: {message}" in err


def test_a_bad_decoder_file_is_an_argument_error_of_its_command(tmp_path, capsys):
    """Read before any model load; named with the flag, under the (sub)command's usage, exit status 2."""
    lst, bad, missing = tmp_path / "list.yaml", tmp_path / "bad.yaml", tmp_path / "missing.yaml"
    lst.write_text("- 1\n- 2\n")
    bad.write_text("threshold: [0.5\n")
    for cmd, f, words in [(["generate"], lst, "a decoder config must be a mapping of decoder keys, got list"),
                          (["bench", "suite", "--problems", "p.jsonl", "--out", "o"], bad, "not YAML: "),
                          (["generate"], missing, "No such file or directory")]:
        tail = ["hi"] if cmd == ["generate"] else []
        err = _error(capsys, *cmd, "--model", "m", "--decoder", str(f), *tail)
        name = " ".join(cmd[:2]) if cmd[0] == "bench" else "generate"
        assert err.startswith(f"usage: python -m repro.engine {name} [-h]"), err
        last = err.splitlines()[-1]
        assert last.startswith(f"python -m repro.engine {name}: error: --decoder {f}: {words}"), err


def test_bench_suite_seed_flag_then_decoder_file_then_12345(tmp_path, monkeypatch, capsys):
    """`--seed` overrides the --decoder file's seed (as every flag overrides the file), which replaces 12345."""
    import repro.engine.suite as S

    seen = []
    monkeypatch.setattr(S, "run_suite", lambda *a, **kw: seen.append((a[2], kw["seed"])) or {})
    dec = tmp_path / "d.yaml"
    dec.write_text("threshold: 0.7\nseed: 7\n")
    base = ["bench", "suite", "--model", "m", "--problems", "p.jsonl", "--out", str(tmp_path), "--device", "cpu",
            "--threads", "1"]
    assert M.main(base) == 0
    assert M.main(base + ["--decoder", str(dec)]) == 0
    assert M.main(base + ["--decoder", str(dec), "--seed", "3", "--threshold", "0.9"]) == 0
    assert [s for _, s in seen] == [12345, 7, 3]
    assert seen[1][0]["threshold"] == 0.7 and seen[2][0]["threshold"] == 0.9
