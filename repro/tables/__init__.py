"""The paper's Table 1 from score summaries and generation records: Markdown, LaTeX (booktabs), CSV.

``aggregate`` builds a tidy long table (one row per model × benchmark × metric, the source of truth);
``render`` pivots it into the paper's layout (rows = models, columns = benchmark × {Acc, TPF}) and
writes the three formats; ``__main__`` is the workflow stage. Beside the table: ``reference`` (the
paper's reported numbers as reference rows, from ``reported.json``), ``compare`` (per-problem
differences between two runs, ``python -m repro.tables compare``), ``sweep`` + ``plot`` (accuracy vs TPF
over a decoder-threshold grid).
"""
