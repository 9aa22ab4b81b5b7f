"""repro: reproducible evaluation of LLaDA2.1-mini(-ORL) diffusion language models.

Subpackages, one concept each: ``config`` (config + suites), ``data`` (benchmark problems),
``prompts`` (versioned prompt templates), ``checkpoint`` (tiny checkpoint, manifest, download, verify),
``paper`` (decoder-config rendering), ``engine`` (embedded block-diffusion engine),
``backends`` (engine / SGLang generation behind one interface), ``scoring`` and ``tables``.
"""

__version__ = "0.1.0"
