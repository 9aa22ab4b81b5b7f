"""Checkpoint tokenizer: ``tokenizer.json`` (``tokenizers`` library) + ``tokenizer_config.json`` chat template.

Special tokens are found **by their string** (``mask_token`` / ``eos_token`` of tokenizer_config.json,
defaulting to ``<|mask|>`` / ``<|endoftext|>``; docs/engine.md §1, §5), never by hard-coded ids. The chat
template is rendered with jinja2 (``messages``, ``add_generation_prompt``, ``raise_exception``), as HF
``apply_chat_template`` does. Encoding adds no BOS/EOS (``add_bos_token`` false, §1).
"""

from __future__ import annotations

import json
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment


class TokenizerError(ValueError):
    """Missing tokenizer files, a special token absent from the vocabulary, or bad chat messages."""


def _token_str(v, default: str) -> str:
    if v is None:
        return default
    return v["content"] if isinstance(v, dict) else str(v)


def _raise(msg):
    raise TokenizerError(f"chat template: {msg}")


class ChatTokenizer:
    """Encode/decode and chat-template rendering for a checkpoint directory.

    Attributes: ``tokenizer`` (``tokenizers.Tokenizer``), ``mask_id``, ``eos_id`` (ints), ``chat_template``
    (str or None), ``vocab_size``.
    """

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer

        root = Path(path)
        tj = root / "tokenizer.json"
        if not tj.is_file():
            raise TokenizerError(f"no tokenizer.json in {root}")
        self.tokenizer = Tokenizer.from_file(str(tj))
        tc_path = root / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text()) if tc_path.is_file() else {}
        self.mask_token = _token_str(tc.get("mask_token"), "<|mask|>")
        self.eos_token = _token_str(tc.get("eos_token"), "<|endoftext|>")
        self.mask_id = self._id(self.mask_token)
        self.eos_id = self._id(self.eos_token)
        self.chat_template = tc.get("chat_template")
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self._template = None

    def _id(self, token: str) -> int:
        i = self.tokenizer.token_to_id(token)
        if i is None:
            raise TokenizerError(f"special token {token!r} is not in the tokenizer vocabulary")
        return i

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token strings map to their ids; no BOS/EOS added)."""
        if not isinstance(text, str):
            raise TokenizerError(f"prompt must be str, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens skipped (docs/engine.md §5)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """Render chat ``messages`` (``[{"role", "content"}]``) with the checkpoint's template.

        Raises TokenizerError if the checkpoint has no template or a message is malformed.
        """
        if not self.chat_template:
            raise TokenizerError("checkpoint tokenizer_config.json has no chat_template")
        if not isinstance(messages, list) or not messages:
            raise TokenizerError("messages must be a non-empty list of {'role', 'content'} dicts")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TokenizerError(f"message {i} must be a dict with str 'role' and 'content', got {m!r}")
        if self._template is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(self.chat_template)
        return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     eos_token=self.eos_token)
