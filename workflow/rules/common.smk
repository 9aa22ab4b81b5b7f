# Config validation (one-line errors naming the key and the allowed values), suite resolution, paths.
import json
import os
import sys

sys.path.insert(0, workflow.basedir)  # the checkout's `repro` package, also without `pip install`

from repro import paths as P
from repro.checkpoint.verify import rerun_trigger
from repro.config import ConfigError, data_dir, results_dir, suite_cells, validate_config, work_dir

try:
    config = validate_config(config)
except ConfigError as e:
    print(f"Config error: {e}", file=sys.stderr)
    sys.exit(1)

SUITE = config["suite"]
S = config["suites"][SUITE]
WORK = str(work_dir(config))
DATA = data_dir(config)
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


def W(template, **kw):
    """Absolute path under the work directory for one of repro.paths' templates."""
    return os.path.join(WORK, template.format(**kw)) if kw else os.path.join(WORK, template)


def model_cfg(wildcards):
    return config["models"][wildcards.model]
