"""The paper's decoding settings (`paper_decoding.json`) and their rendering into backend configs.

``DEFAULT_PAPER_DECODING`` is the packaged copy used when a checkpoint ships none (the base model
LLaDA2.1-mini has no such file; the ORL model card says the file in the checkpoint is authoritative).
Schema: ``paper_decoding.schema.json`` beside it; loading, validation and the engine -> SGLang mapping:
``repro.paper.decoding``; the jinja2 renderer and CLI: ``repro.paper.render_config``.
"""

from pathlib import Path

DEFAULT_PAPER_DECODING = Path(__file__).with_name("paper_decoding.json")
