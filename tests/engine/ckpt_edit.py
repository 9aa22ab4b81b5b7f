"""Helper of the loading tests: a copy of a sharded checkpoint with one tensor's shard file edited in place."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file


def edited_copy(src: Path, dst: Path, name: str, edit) -> dict:
    """Copy checkpoint ``src`` to ``dst`` and rewrite the shard holding tensor ``name`` after ``edit(tensors)``
    (a dict of that shard's tensors, changed in place). Returns the copy's index ``weight_map``."""
    shutil.copytree(src, dst)
    wm = json.loads((dst / "model.safetensors.index.json").read_text())["weight_map"]
    f = dst / wm[name]
    t = load_file(str(f))
    edit(t)
    save_file(t, str(f), metadata={"format": "pt"})
    return wm
