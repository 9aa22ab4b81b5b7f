"""scripts/lint_workflow.py (CI's `snakemake --lint` gate): findings are parsed per rule / file, the justified
ones pass, any other fails."""

import importlib.util

from repro.config import REPO_ROOT

spec = importlib.util.spec_from_file_location("lint_workflow", REPO_ROOT / "scripts" / "lint_workflow.py")
lint = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lint)

SAMPLE = """Lints for snakefile /x/workflow/rules/images.smk:
    * Mixed rules and functions in same snakefile.:
      Small one-liner functions used only once should be defined as lambda

Lints for rule score (line 4, /x/workflow/rules/score.smk):
    * Specify a conda environment or container for each rule.:
      This way, the used software for each specific step is documented.
    * Shell command directly uses variable PY from outside of the rule:
      It is recommended to pass all files as input and output.
    * Shell command directly uses variable WORK from outside of the rule:
      It is recommended to pass all files as input and output.
"""


def test_findings_are_parsed_and_only_the_listed_ones_are_justified():
    found = lint.findings(SAMPLE)
    assert found == [("images.smk", "Mixed rules and functions in same snakefile"),
                     ("rule score", "Specify a conda environment or container for each rule"),
                     ("rule score", "Shell command directly uses variable PY from outside of the rule"),
                     ("rule score", "Shell command directly uses variable WORK from outside of the rule")]
    verdicts = [lint.justification(*f) is not None for f in found]
    assert verdicts == [True, True, True, False]  # WORK must be a param: not justified
    assert lint.justification("common.smk", "Mixed rules and functions in same snakefile") is None
