"""Load and validate `config.yaml`; resolve the selected suite; paths under the work directory.

Validation uses the JSON schema `workflow/schemas/config.schema.json` (draft 2020-12) and then the
cross-references a schema cannot express (the selected suite exists, every model a suite names is
defined). Every problem is reported as **one line** naming the key and the allowed values, e.g.::

    config.yaml: unknown key 'limt' in suites.smoke; allowed: benchmarks, decoder_suite, device, ...

Where a mistake comes from how Snakemake merges config, the line says so and gives the fix: an overlay
that switches a model's source form (the merged source has keys of two forms), a nested value given
with ``--config`` (it arrives as a string). ``yaml_syntax_error`` names the file, line and column of a
YAML syntax error, which Snakemake's own message does not.

This module runs no stage; the Snakefile and the `python -m repro.*` stages import it.
``python -m repro.config check-yaml FILE...`` (used by scripts/_snakemake_common.sh) reports YAML
syntax errors before Snakemake reads the files.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml

from repro import benchmarks

REPO_ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.json"


class ConfigError(ValueError):
    """A config problem, worded as one line that names the file, the key and the allowed values."""


def _where(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "top level"


def _allowed(schema: dict) -> str:
    if "enum" in schema:
        return ", ".join(map(str, schema["enum"]))
    if "const" in schema:
        return str(schema["const"])
    return ""


_JSON_TYPES = {"integer": lambda x: isinstance(x, int) and not isinstance(x, bool),
               "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
               "boolean": lambda x: isinstance(x, bool), "null": lambda x: x is None,
               "string": lambda x: isinstance(x, str), "array": lambda x: isinstance(x, list),
               "object": lambda x: isinstance(x, dict)}


def _string_of_type(value, types) -> bool:
    """True when ``value`` is a string whose YAML reading has one of the JSON-schema ``types`` (``'3'``
    for integer, ``'true'`` for boolean): a nested value that came through ``--config`` unparsed."""
    if not isinstance(value, str) or "string" in types:
        return False
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return False
    return any(_JSON_TYPES[t](parsed) for t in types if t in _JSON_TYPES)


def _string_hint(source: str) -> str:
    if "--config" in source:
        return ("; --config passes nested values as strings: put nested settings in an overlay file "
                "instead (--configfile config.yaml overlay.yaml)")
    return "; a quoted value is a string in YAML: write it without quotes"


# The source forms of a model (schema: models.*.source.oneOf), by the keys only that form has.
_FORM_NAMES = {"hf": "hub", "local": "local", "tiny": "tiny", "replay": "replay"}


def _source_forms(one_of: list[dict]) -> list[tuple[str, list[str]]]:
    """(type, keys only this form has) for each form of the oneOf, e.g. ('hf', ['repo_id', 'revision'])."""
    props = [set(f.get("properties", {})) - {"type"} for f in one_of]
    out = []
    for i, f in enumerate(one_of):
        own = props[i] - set().union(*(p for j, p in enumerate(props) if j != i))
        out.append((f.get("properties", {}).get("type", {}).get("const", "?"), sorted(own)))
    return out


def _source_error(err: jsonschema.ValidationError, source: str, where: str, cfg: dict | None) -> str:
    allowed = "{type: hf, repo_id, revision} | {type: local, path} | {type: tiny, seed} | {type: replay, samples}"
    inst = err.instance if isinstance(err.instance, dict) else {}
    forms = _source_forms(err.schema["oneOf"])
    present = [(t, [k for k in own if k in inst]) for t, own in forms]
    present = [(t, ks) for t, ks in present if ks]
    if len(present) >= 2:
        kinds = " and ".join(f"the {_FORM_NAMES.get(t, t)} form ({', '.join(ks)})" for t, ks in present)
        msg = f"{source}: {where} mixes keys of {kinds}"
        if "+" in source:  # several config files / --config: Snakemake merged the source dicts key by key
            msg += ("; an overlay (--configfile config.yaml overlay.yaml, or --config) merges nested keys into "
                    "config.yaml's, so it cannot switch a model to another source form")
        path = list(err.absolute_path)
        model = str(path[1]) if len(path) >= 3 and path[0] == "models" else "my-model"
        entry = ((cfg or {}).get("models") or {}).get(model) or {}
        suite = (cfg or {}).get("suite") or "SUITE"
        new = f"{model}-{inst.get('type') or 'new'}"
        keys = {"hf": "repo_id: ..., revision: ...", "local": f"path: {inst.get('path') or '...'}",
                "tiny": f"seed: {inst.get('seed', 0)}"}.get(inst.get("type"), "...")
        label = json.dumps(f"{entry['label']} ({inst.get('type')})" if entry.get("label") else "...")
        msg += (f"; define a new model name instead, e.g. models: {{{new}: {{label: {label}, "
                f"role: {entry.get('role') or 'base|orl'}, decoder: {entry.get('decoder') or 'llada|llada-orl'}, "
                f"source: {{type: {inst.get('type') or '...'}, {keys}}}}}}}, and use it in the suite "
                f"(suites: {{{suite}: {{models: [{new}]}}}})")
        if inst.get("type") == "local":
            msg += f", or run: bash scripts/main_table.sh {model} {inst.get('path') or 'CKPT_DIR'}"
        return msg
    # one form named by `type`: say what that form lacks or has wrong
    detail = ""
    idx = [i for i, f in enumerate(err.schema["oneOf"])
           if f.get("properties", {}).get("type", {}).get("const") == inst.get("type")]
    subs = [e for e in (err.context or []) if idx and e.relative_schema_path and e.relative_schema_path[0] == idx[0]]
    if subs:
        sub = min(subs, key=lambda e: len(e.absolute_path))
        if sub.validator == "type" and sub.absolute_path:
            t = sub.schema["type"]
            ts = t if isinstance(t, list) else [t]
            detail = (f" ({where}.{sub.absolute_path[-1]} must be {' or '.join(ts)}, got {sub.instance!r}"
                      + (_string_hint(source) if _string_of_type(sub.instance, ts) else "") + ")")
        else:
            detail = f" ({sub.message})"
    return f"{source}: {where} = {err.instance!r} matches no source form{detail}; allowed: {allowed}"


def _nested_key_hint(key: str, err: jsonschema.ValidationError, source: str, cfg: dict | None) -> str:
    """For a top-level key that belongs to a suite or a model (``limit``, ``precision``): where it goes, e.g.
    ``suites.smoke.limit``, written as an overlay file's lines (``--config`` cannot pass nested values)."""
    props = err.schema.get("properties", {})
    suite = (cfg or {}).get("suite")
    suite = suite if isinstance(suite, str) else "SUITE"
    value = json.dumps(err.instance.get(key)) if isinstance(err.instance, dict) else "..."
    for section, name in (("suites", suite), ("models", "MODEL")):
        if key in props.get(section, {}).get("additionalProperties", {}).get("properties", {}):
            return (f"; '{key}' is a key of each entry of {section}: set {section}.{name}.{key} in an overlay file "
                    f"(--configfile config.yaml overlay.yaml, the overlay holding "
                    f"'{section}: {{{name}: {{{key}: {value}}}}}')"
                    + (", as --config cannot pass nested values" if "--config" in source else ""))
    return ""


def _one_line(err: jsonschema.ValidationError, source: str, cfg: dict | None = None) -> str:
    where = _where(err.absolute_path)
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
        key = extra[0] if extra else "?"
        if allowed:
            msg = f"{source}: unknown key '{key}' in {where}; allowed: {', '.join(allowed)}"
            return msg + (_nested_key_hint(key, err, source, cfg) if not err.absolute_path else "")
        return f"{source}: unknown key '{key}' in {where}"
    if v == "enum":
        return f"{source}: {where} = {err.instance!r} is not allowed; allowed: {_allowed(err.schema)}"
    if v == "required":
        return f"{source}: {err.message.split(' is a required')[0]} is missing in {where}"
    if v == "type":
        ts = err.schema["type"] if isinstance(err.schema["type"], list) else [err.schema["type"]]
        msg = f"{source}: {where} must be {' or '.join(ts)}, got {err.instance!r}"
        if len(err.absolute_path) >= 2 and _string_of_type(err.instance, ts):
            msg += _string_hint(source)
        return msg
    if v == "oneOf" and where.endswith("source"):
        return _source_error(err, source, where, cfg)
    bound = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}.get(v)
    if bound:  # jsonschema's "0 is less than or equal to the minimum of 0" reads as a riddle
        return f"{source}: {where} must be {bound} {err.validator_value}, got {err.instance!r}"
    return f"{source}: {where}: {err.message}"


def _fill_defaults(cfg: dict) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg.setdefault("work_dir", None)
    cfg.setdefault("data_dir", None)
    cfg.setdefault("results_dir", None)
    sc = cfg.setdefault("scoring", {}) or {}
    cfg["scoring"] = sc
    sc.setdefault("workers", 2)
    sc.setdefault("timeout_s", 10)
    ct = cfg.setdefault("containers", {}) or {}
    cfg["containers"] = ct
    ct.setdefault("enabled", False)
    for s in cfg.get("suites", {}).values():
        if isinstance(s, dict):
            s.setdefault("limit", None)
            s.setdefault("decoder_suite", "main")
            s.setdefault("shards", 1)
            s.setdefault("group_benchmarks", False)
            s.setdefault("max_new_tokens", None)
            s.setdefault("builtin_data", False)
            s.setdefault("reported", False)
            s.setdefault("compare", None)
            s.setdefault("sweep", None)
    return cfg


def validate_config(cfg: dict, source: str = "config.yaml") -> dict:
    """Validate ``cfg`` against the schema and cross-references; return it with defaults filled.

    Raises:
        ConfigError: one line naming the offending key and the allowed values.
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: the config must be a mapping, got {type(cfg).__name__}")
    schema = json.loads(SCHEMA_PATH.read_text())
    schema["$defs"]["benchmark"]["enum"] = list(benchmarks.names())  # the declared benchmarks
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        # the deepest error is the most specific one
        err = max(errors, key=lambda e: len(e.absolute_path))
        raise ConfigError(_one_line(err, source, cfg))
    cfg = _fill_defaults(cfg)
    suites = cfg["suites"]
    if cfg["suite"] not in suites:
        raise ConfigError(f"{source}: suite = {cfg['suite']!r} is not defined; allowed: {', '.join(sorted(suites))}")
    for sname, s in suites.items():
        for m in s["models"]:
            if m not in cfg["models"]:
                raise ConfigError(f"{source}: suites.{sname}.models names unknown model {m!r}; "
                                  f"allowed: {', '.join(sorted(cfg['models']))}")
        for key, names in (("compare", [m for pair in s["compare"] or [] for m in pair]),
                           ("sweep.models", (s["sweep"] or {}).get("models", []))):
            for m in names:
                if m not in cfg["models"]:
                    raise ConfigError(f"{source}: suites.{sname}.{key} names unknown model {m!r}; "
                                      f"allowed: {', '.join(sorted(cfg['models']))}")
                if key == "sweep.models" and is_replay(cfg, m):
                    raise ConfigError(f"{source}: suites.{sname}.sweep.models names {m!r}, a replay model (its "
                                      "samples are fixed); sweep models that generate")
    for mname, m in cfg["models"].items():  # ranks per request: the engine's (repro/engine/ranks.py)
        tp = m.get("tensor_parallel_size", 1)
        if tp > 1 and (cfg["backend"] != "engine" or is_replay(cfg, mname)):
            raise ConfigError(f"{source}: models.{mname}.tensor_parallel_size = {tp} needs backend: engine and a model "
                              f"that generates (backend is {cfg['backend']!r}); remove it or set it to 1")
    _check_decoder_names(cfg, source)
    return cfg


def _checkpoint_decoder_names(cfg: dict, name: str, model: dict) -> set[str]:
    """Decoder model names in the checkpoint's own ``paper_decoding.json`` where it is on disk already (a local
    source's folder, or the work directory's copy), else an empty set. Never raises."""
    from repro import paths

    src = model.get("source") or {}
    files = [work_dir(cfg) / paths.CHECKPOINT.format(model=name) / "paper_decoding.json"]
    if src.get("type") == "local" and src.get("path"):
        files.append(Path(str(src["path"])).expanduser() / "paper_decoding.json")
    out: set[str] = set()
    for f in files:
        try:
            out |= {m for models in json.loads(f.read_text())["suites"].values() for m in models}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    return out


def _check_decoder_names(cfg: dict, source: str) -> None:
    """Stop a misspelt ``models.<m>.decoder`` or ``suites.<s>.decoder_suite`` at start-up, before any job.

    The names live in ``paper_decoding.json``, whose authoritative copy is the checkpoint's own and may not be
    downloaded yet, so only a name that is *not* in the packaged copy (``repro/paper/paper_decoding.json``) but
    close to one of its names (difflib ratio ≥ 0.75, e.g. ``llada-orll`` for ``llada-orl``) is refused; another
    unknown name is left to the checkpoint's copy, which the decoder-config job checks (naming that file); a
    close name that the checkpoint's copy on disk defines (a local source, or ``<work>/hf/<model>/``) is accepted.

    Raises:
        ConfigError: one line naming the key in ``source``, the close name and the file it comes from.
    """
    import difflib

    from repro.paper import DEFAULT_PAPER_DECODING

    try:
        suites = json.loads(DEFAULT_PAPER_DECODING.read_text())["suites"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    rel = os.path.relpath(DEFAULT_PAPER_DECODING, REPO_ROOT)

    def close(name, known):
        if name in known:
            return None
        hit = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        return hit[0] if hit else None

    for sname, s in cfg["suites"].items():
        ds = s.get("decoder_suite", "main")
        hit = close(ds, suites)
        if hit:
            raise ConfigError(f"{source}: suites.{sname}.decoder_suite = {ds!r} is not a suite of {rel}; did you "
                              f"mean {hit!r}? (allowed there: {', '.join(sorted(suites))})")
    names = {m for models in suites.values() for m in models}
    for mname, m in cfg["models"].items():
        dec = m.get("decoder")
        hit = close(dec, names) if isinstance(dec, str) else None
        if hit and dec in _checkpoint_decoder_names(cfg, mname, m):
            continue  # the checkpoint's own copy (authoritative) defines it
        if hit:
            raise ConfigError(f"{source}: models.{mname}.decoder = {dec!r} is not a decoder model of {rel}; did you "
                              f"mean {hit!r}? (allowed there: {', '.join(sorted(names))})")


def is_replay(cfg: dict, model: str) -> bool:
    """Whether ``model`` replays completions from a samples file (``source.type: replay``) instead of
    generating them (``repro.backends.replay``)."""
    return (cfg["models"][model].get("source") or {}).get("type") == "replay"


def replay_samples_path(cfg: dict, model: str, bench: str) -> str | None:
    """The absolute samples file replayed model ``model`` reads for benchmark ``bench``: ``{bench}`` in
    ``source.samples`` filled in, ``~`` expanded, a relative path taken from the current directory (the
    checkout, where Snakemake runs the jobs, as ``repro.backends.replay`` reads it); None for
    ``samples: reference`` (the benchmarks' own solutions, no file)."""
    samples = cfg["models"][model]["source"]["samples"]
    if samples == "reference":
        return None
    return os.path.abspath(os.path.expanduser(samples.replace("{bench}", bench)))


def missing_replay_samples(cfg: dict, suite: str, source: str = "config.yaml") -> list[str]:
    """One error line per samples file that a replayed model of suite ``suite`` (its ``models`` and the models
    of its ``compare`` pairs) needs for one of the suite's benchmarks and that does not exist, naming the model,
    the file, the config files and the fix; [] when all exist. Checked at start-up: without the file Snakemake
    finds no rule that replays the cell and falls back to generating it, which fails with a traceback
    (KeyError 'role') instead of naming the file."""
    s = cfg["suites"][suite]
    models = dict.fromkeys(list(s["models"]) + [m for pair in s.get("compare") or [] for m in pair])
    errors = []
    for m in models:
        if m not in cfg["models"] or not is_replay(cfg, m):
            continue
        missing = [p for b in s["benchmarks"] if (p := replay_samples_path(cfg, m, b)) and not os.path.isfile(p)]
        for p in dict.fromkeys(missing):
            errors.append(f"Config error ({source}): model {m} replays samples from {p}, which does not exist; "
                          "set models." + m + ".source.samples to an existing JSONL of {id, completion} records "
                          "(an absolute path, or relative to the checkout; '{bench}' in it picks one file per "
                          "benchmark), or drop the model from suite " + repr(suite))
    return errors


def missing_local_checkpoints(cfg: dict, models, source: str = "config.yaml", suite: str = "SUITE") -> list[str]:
    """One error line per model of ``models`` whose checkpoint source is a local folder (``{type: local, path}``)
    that is not one (missing, a dangling link, a file), naming the model, the path, the config files and the fix;
    [] when all are there. Checked at start-up: Snakemake alone finds it only when the model's download job runs,
    deep in the output and once per retry."""
    from repro.io import not_a

    errors = []
    for m in dict.fromkeys(models):
        src = (cfg["models"].get(m) or {}).get("source") or {}
        why = not_a(Path(src["path"]).expanduser(), "folder") if src.get("type") == "local" else None
        if why:
            errors.append(f"Config error: models.{m}.source.path {src['path']} ({source}) {why}; point it at the "
                          "checkpoint folder (the one holding config.json, the *.safetensors and "
                          f"checkpoint_manifest.json), e.g. models: {{{m}: {{source: {{type: local, path: "
                          f"/data/LLaDA2.1-mini-ORL}}}}}} in your overlay, or drop {m} from suite {suite!r}")
    return errors


def yaml_syntax_error(path: str | os.PathLike) -> str | None:
    """One line naming the file, line and column of a YAML syntax error in ``path`` (None if it parses).

    Only syntax (scanner, parser, composer, reader) errors: what YAML forbids whatever the loader. Snakemake's
    own message for these is "Config file is not valid JSON or YAML" without a line; the Snakefile checks
    ``config.yaml`` with this before its ``configfile:`` directive, and ``scripts/_snakemake_common.sh``
    (``python -m repro.config check-yaml FILE...``) every ``--configfile`` before calling Snakemake (which
    reads those before any Snakefile code runs). A missing file is left to Snakemake's own message.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        return None
    except UnicodeDecodeError as e:
        return f"{path}: not valid YAML: not UTF-8 text ({e.reason} at byte {e.start})"
    try:
        json.loads(text)  # Snakemake reads a config file as JSON first
        return None
    except ValueError:
        pass
    try:
        yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.scanner.ScannerError, yaml.parser.ParserError, yaml.composer.ComposerError,
            yaml.reader.ReaderError) as e:
        mark = getattr(e, "problem_mark", None)
        ctx, ctx_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        lines = text.splitlines()
        # The line to fix comes first. For an unclosed flow collection ('[', '{', a quote) or a key without
        # ':' that is where the construct began (the context mark; the parser notices lines later). For a
        # block mapping or sequence the context mark is merely where that collection starts (often line 1
        # of the file) and the failing line is the problem mark: lead with it, the context goes after.
        block = bool(ctx) and ctx.startswith("while parsing a block")
        at = mark if (block and mark is not None) else (ctx_mark or mark)
        if at is None:
            return f"{path}: not valid YAML: {problem}"
        msg = f"{path}, line {at.line + 1}, column {at.column + 1}: not valid YAML: "
        if block and ctx_mark is not None:
            msg += f"{problem} ({ctx.removeprefix('while parsing ')} that starts at line {ctx_mark.line + 1})"
        elif ctx and ctx_mark is not None:
            msg += f"{ctx}: {problem}"
            if mark is not None and (mark.line, mark.column) != (ctx_mark.line, ctx_mark.column):
                msg += f" (at line {mark.line + 1}, column {mark.column + 1})"
        else:
            msg += problem
        if at.line < len(lines):
            msg += f"; line {at.line + 1} reads: {lines[at.line].rstrip()!r}"
        if problem == "mapping values are not allowed here":
            # `key value` without ':' continues as a plain scalar into the next line, where the ':' is seen
            prev = next((i for i in range(at.line - 1, -1, -1)
                         if lines[i].strip() and not lines[i].lstrip().startswith("#")), None)
            if prev is not None and ":" not in lines[prev] and not lines[prev].lstrip().startswith("-"):
                msg += f"; line {prev + 1} ({lines[prev].strip()!r}) has no ':' (a missing colon?)"
        if block and "expected <block end>" in problem:
            msg += "; its indentation does not match the keys above it"
        if "'\\t'" in problem:
            msg += "; indent with spaces, not tabs"
        return msg
    return None


def load_config(path: str | os.PathLike = REPO_ROOT / "config.yaml", overrides: dict | None = None) -> dict:
    """Read a YAML config file, apply ``overrides`` (top-level keys), validate; return the config."""
    path = Path(path)
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as e:
        raise ConfigError(yaml_syntax_error(path) or f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    cfg.update(overrides or {})
    return validate_config(cfg, source=path.name)


def work_dir(cfg: dict) -> Path:
    """The work directory: ``cfg['work_dir']``, else ``$ORL_EVAL_WORK``, else ``<checkout>/work``."""
    wd = cfg.get("work_dir") or os.environ.get("ORL_EVAL_WORK") or str(REPO_ROOT / "work")
    return Path(wd).expanduser().resolve()


def results_dir(cfg: dict) -> Path:
    """Where tables go: ``cfg['results_dir']``, else ``<checkout>/results``."""
    return Path(cfg.get("results_dir") or REPO_ROOT / "results").expanduser().resolve()


def data_dir(cfg: dict) -> Path | None:
    """The local data directory: ``cfg['data_dir']``, else ``$ORL_EVAL_DATA``, else None."""
    d = cfg.get("data_dir") or os.environ.get("ORL_EVAL_DATA")
    return Path(d).expanduser().resolve() if d else None


@dataclass(frozen=True)
class DataDirOrigin:
    """Where :func:`data_dir` took its path, for the start-up messages (:func:`data_dir_origin`).

    ``source``: ``"data_dir in the config"`` (which wins over ``$ORL_EVAL_DATA``, said when that is set too),
    ``"$ORL_EVAL_DATA"``, or None when neither is set. ``fix``: the setting to change to point the pipeline at
    another data folder. ``env_unused``: ``$ORL_EVAL_DATA`` when it names another folder than the config's
    ``data_dir`` (which wins, so the environment's folder is not read), else None."""

    source: str | None
    fix: str
    env_unused: str | None


def data_dir_origin(cfg: dict, environ=os.environ) -> DataDirOrigin:
    """The :class:`DataDirOrigin` of ``cfg``'s data directory (``environ``: the environment to read)."""
    env = environ.get("ORL_EVAL_DATA")
    if cfg.get("data_dir"):
        unused = env if env and Path(env).expanduser().resolve() != data_dir(cfg) else None
        return DataDirOrigin("data_dir in the config" + (f", which wins over $ORL_EVAL_DATA={env}" if env else ""),
                             "data_dir (in config.yaml, an overlay or --config)", unused)
    if env:
        return DataDirOrigin("$ORL_EVAL_DATA", "ORL_EVAL_DATA", None)
    return DataDirOrigin(None, "data_dir (in config.yaml, an overlay or --config)", None)


@dataclass(frozen=True)
class Cell:
    """One (model, benchmark, seed) cell of the table."""

    model: str
    benchmark: str
    seed: int


def suite_cells(cfg: dict, suite: str | None = None) -> list[Cell]:
    """Every (model, benchmark, seed) of a suite, models in table order."""
    s = cfg["suites"][suite or cfg["suite"]]
    return [Cell(m, b, seed) for m in s["models"] for b in s["benchmarks"] for seed in s["seeds"]]


def main(argv: list[str] | None = None) -> int:
    """``python -m repro.config check-yaml FILE...``: exit 65 (EX_DATAERR) with one line per file that is
    missing or not valid YAML (file, line, column), 0 when every file exists and parses."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m repro.config", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check-yaml", help="report YAML syntax errors with file, line and column").add_argument(
        "files", nargs="+", metavar="FILE")
    a = ap.parse_args(argv)
    errors = [f"{f}: no such file; give the path of an existing config overlay" if not Path(f).is_file()
              else yaml_syntax_error(f) for f in a.files]
    errors = [e for e in errors if e]
    for e in errors:
        print(f"Config error: {e}", file=sys.stderr)
    return 65 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
