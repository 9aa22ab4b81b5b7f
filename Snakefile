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

# The run works against the checkout, wherever Snakemake was started (`-s path/to/Snakefile` from another
# directory): Snakemake's state (.snakemake: recorded params, locks) and the default work/ and results/ live
# there. `--directory DIR` still picks another working directory (Snakemake then ignores `workdir:`).
# Relative paths in ORL_EVAL_DATA / ORL_EVAL_WORK are taken relative to where the command was typed.
INVOKED_IN = os.getcwd()  # where the command was typed (before `workdir:`): relative targets are taken from here
for _var in ("ORL_EVAL_DATA", "ORL_EVAL_WORK"):
    if os.environ.get(_var):
        os.environ[_var] = os.path.abspath(os.environ[_var])
if workflow.overwrite_workdir is None and os.path.realpath(os.getcwd()) != os.path.realpath(workflow.basedir):
    print(f"note: running in the checkout {workflow.basedir} (its .snakemake state, work/ and results/), "
          f"not in {os.getcwd()}", file=sys.stderr)


workdir: workflow.basedir


# A YAML syntax error in config.yaml: name the line and column (Snakemake's `configfile:` only says "not
# valid JSON or YAML"). Files given with --configfile are read by Snakemake before this code runs;
# scripts/_snakemake_common.sh checks those the same way before calling Snakemake.
_yaml_error = yaml_syntax_error(os.path.join(workflow.basedir, "config.yaml"))
if _yaml_error:
    print(f"Config error: {_yaml_error}", file=sys.stderr)
    sys.exit(1)


# The checkout's config.yaml applies first. When the command line already names it first (--configfile config.yaml
# overlay.yaml), it is not read again here: the result is the same, and Snakemake's header then lists it once.
_first_cli_file = [os.path.realpath(str(f)) for f in (workflow.overwrite_configfiles or [])][:1]
if _first_cli_file != [os.path.realpath(os.path.join(workflow.basedir, "config.yaml"))]:
    configfile: os.path.join(workflow.basedir, "config.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/cluster.smk"
include: "workflow/rules/images.smk"
include: "workflow/rules/checkpoints.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/decoders.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/analysis_common.smk"
include: "workflow/rules/analysis.smk"


# a mistyped target: one line naming the targets there are (analysis_common.smk: _unknown_targets)
if workflow.is_main_process and (_unknown := _unknown_targets()):
    print(_unknown, file=sys.stderr)
    sys.exit(1)
