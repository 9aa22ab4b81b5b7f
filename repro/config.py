"""Load and validate `config.yaml`; resolve the selected suite; paths under the work directory.

Validation uses the JSON schema `workflow/schemas/config.schema.json` (draft 2020-12) and then the
cross-references a schema cannot express (the selected suite exists, every model a suite names is
defined). Every problem is reported as **one line** naming the key and the allowed values, e.g.::

    config.yaml: unknown key 'limt' in suites.smoke; allowed: benchmarks, decoder_suite, device, ...

This module does not run anything; the Snakefile and the `python -m repro.*` stages import it.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
SCHEMA_PATH = REPO_ROOT / "workflow" / "schemas" / "config.schema.json"
BENCHMARKS = ("gsm8k", "math500", "humaneval", "mbpp")


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


def _one_line(err: jsonschema.ValidationError, source: str) -> str:
    where = _where(err.absolute_path)
    v = err.validator
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
        key = extra[0] if extra else "?"
        if allowed:
            return f"{source}: unknown key '{key}' in {where}; allowed: {', '.join(allowed)}"
        return f"{source}: unknown key '{key}' in {where}"
    if v == "enum":
        return f"{source}: {where} = {err.instance!r} is not allowed; allowed: {_allowed(err.schema)}"
    if v == "required":
        return f"{source}: {err.message.split(' is a required')[0]} is missing in {where}"
    if v == "type":
        t = err.schema["type"]
        t = " or ".join(t) if isinstance(t, list) else t
        return f"{source}: {where} must be {t}, got {err.instance!r}"
    if v == "oneOf" and where.endswith("source"):
        return (f"{source}: {where} = {err.instance!r} matches no source form; allowed: "
                "{type: hf, repo_id, revision} | {type: local, path} | {type: tiny, seed}")
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
            s.setdefault("max_new_tokens", None)
            s.setdefault("builtin_data", False)
    return cfg


def validate_config(cfg: dict, source: str = "config.yaml") -> dict:
    """Validate ``cfg`` against the schema and cross-references; return it with defaults filled.

    Raises:
        ConfigError: one line naming the offending key and the allowed values.
    """
    if not isinstance(cfg, dict):
        raise ConfigError(f"{source}: the config must be a mapping, got {type(cfg).__name__}")
    schema = json.loads(SCHEMA_PATH.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        # the deepest error is the most specific one
        err = max(errors, key=lambda e: len(e.absolute_path))
        raise ConfigError(_one_line(err, source))
    cfg = _fill_defaults(cfg)
    suites = cfg["suites"]
    if cfg["suite"] not in suites:
        raise ConfigError(f"{source}: suite = {cfg['suite']!r} is not defined; allowed: {', '.join(sorted(suites))}")
    for sname, s in suites.items():
        for m in s["models"]:
            if m not in cfg["models"]:
                raise ConfigError(f"{source}: suites.{sname}.models names unknown model {m!r}; "
                                  f"allowed: {', '.join(sorted(cfg['models']))}")
    return cfg


def load_config(path: str | os.PathLike = REPO_ROOT / "config.yaml", overrides: dict | None = None) -> dict:
    """Read a YAML config file, apply ``overrides`` (top-level keys), validate; return the config."""
    path = Path(path)
    try:
        cfg = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
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
class Cell:
    """One (model, benchmark, seed) cell of the table."""

    model: str
    benchmark: str
    seed: int


def suite_cells(cfg: dict, suite: str | None = None) -> list[Cell]:
    """Every (model, benchmark, seed) of a suite, models in table order."""
    s = cfg["suites"][suite or cfg["suite"]]
    return [Cell(m, b, seed) for m in s["models"] for b in s["benchmarks"] for seed in s["seeds"]]
