# The evaluation pipeline for LLaDA2.1-mini(-ORL): thin entry point. Stages live in workflow/rules/*.smk,
# every rule calls `python -m repro.<stage>`. Default target: main_table (the paper's Table 1).
#
#   snakemake --cores 2 main_table                      # smoke suite: tiny model, CPU (default)
#   snakemake -n main_table --config suite=paper        # the paper suite's full DAG (GPU, HF checkpoints)

import os

from snakemake.utils import min_version

min_version("9.20")


configfile: os.path.join(workflow.basedir, "config.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/images.smk"
include: "workflow/rules/checkpoints.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/decoders.smk"
include: "workflow/rules/generate.smk"
include: "workflow/rules/score.smk"
include: "workflow/rules/tables.smk"
