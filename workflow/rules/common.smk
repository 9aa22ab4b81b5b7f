# Config validation (one-line errors naming the key and the allowed values), suite resolution, paths.
import json
import os
import sys

sys.path.insert(0, workflow.basedir)  # the checkout's `repro` package, also without `pip install`

from repro import paths as P
from repro.checkpoint.verify import rerun_trigger
from repro.provenance import tree_digest
from repro.config import ConfigError, data_dir, is_replay, results_dir, suite_cells, validate_config, work_dir

_sources = [os.path.basename(str(f)) for f in (workflow.configfiles or [])]
_source = " + ".join(dict.fromkeys(_sources)) or "config.yaml"
if getattr(workflow.config_settings, "config", None):
    _source += " + --config"
try:
    config = validate_config(config, source=_source)
except ConfigError as e:
    print(f"Config error: {e}", file=sys.stderr)
    sys.exit(1)

SUITE = config["suite"]
S = config["suites"][SUITE]
WORK = str(work_dir(config))
DATA = data_dir(config)
if DATA is not None and not DATA.is_dir():
    print(f"Config error: data directory {DATA} (data_dir / ORL_EVAL_DATA) does not exist; point it at a folder "
          "holding gsm8k.jsonl, math500.jsonl, humaneval.jsonl, mbpp.jsonl, or unset it", file=sys.stderr)
    sys.exit(1)
RESULTS = os.path.join(str(results_dir(config)), SUITE)
# Inside a container the image's python runs the stages; natively the interpreter running Snakemake.
PY = "python" if config["containers"]["enabled"] else sys.executable


wildcard_constraints:
    model="[A-Za-z0-9][A-Za-z0-9._-]*",
    bench="gsm8k|math500|humaneval|mbpp",
    seed=r"\d+",
    suite="[A-Za-z0-9_-]+",
    shard=r"\d+",
    nshards=r"\d+",


def logged(cmd, streams="> {log} 2>&1"):
    """Shell command with its output in the rule's log; on failure the log's tail goes to the console, so
    the error message (which names the file and the fix) is seen without opening the log."""
    return f"{cmd} {streams} || {{{{ echo '--- last lines of {{log}}:' >&2; tail -n 15 {{log}} >&2; exit 1; }}}}"


def W(template, **kw):
    """Absolute path under the work directory for one of repro.paths' templates."""
    return os.path.join(WORK, template.format(**kw)) if kw else os.path.join(WORK, template)


def model_cfg(wildcards):
    return config["models"][wildcards.model]
