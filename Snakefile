# The evaluation pipeline for LLaDA2.1-mini(-ORL): thin entry point. Stages live in workflow/rules/*.smk,
# every rule calls `python -m repro.<stage>`. Default target: main_table (the paper's Table 1).
#
#   snakemake --cores 2 main_table                      # smoke suite: tiny model, CPU (default)
#   snakemake -n main_table --config suite=paper        # the paper suite's full DAG (GPU, HF checkpoints)

import os
import sys

from snakemake.utils import min_version

min_version("9.20")

sys.path.insert(0, workflow.basedir)  # the checkout's `repro` package, also without `pip install`
from repro.config import yaml_syntax_error

# A YAML syntax error in config.yaml: name the line and column (Snakemake's `configfile:` only says "not
# valid JSON or YAML"). Files given with --configfile are read by Snakemake before this code runs;
# scripts/_snakemake_common.sh checks those the same way before calling Snakemake.
_yaml_error = yaml_syntax_error(os.path.join(workflow.basedir, "config.yaml"))
if _yaml_error:
    print(f"Config error: {_yaml_error}", file=sys.stderr)
    sys.exit(1)


configfile: os.path.join(workflow.basedir, "config.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/images.smk"
include: "workflow/rules/checkpoints.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/decoders.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/analysis.smk"
