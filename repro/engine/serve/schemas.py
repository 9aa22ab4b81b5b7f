"""Request bodies of the server (pydantic, strict: no type coercion, unknown fields refused) and the one error
shape every 4xx/5xx answer uses.

* ``POST /generate`` — :class:`GenerateRequest`: ``messages`` (chat template applied) **or** ``prompt`` (used as
  is), ``max_new_tokens``, the decoder overrides ``threshold`` / ``edit_threshold`` (and ``temperature`` in
  [0, 2] as the OpenAI endpoints, ``seed``), ``stop``, ``stream`` (default true: one JSON line per committed
  block).
* ``POST /v1/chat/completions`` — :class:`ChatRequest`, ``POST /v1/completions`` — :class:`CompletionRequest`:
  the OpenAI request fields (https://platform.openai.com/docs/api-reference/chat/create and /completions/create)
  plus ``threshold`` / ``edit_threshold``. OpenAI fields the engine cannot honour (``n`` > 1, ``top_p`` < 1,
  penalties, ``logprobs``, ``logit_bias``, ``echo``, ``best_of``, ``suffix``) are accepted only at their
  neutral value; any other value is a 400 naming the field. An absent ``temperature`` means the model's
  decoder default (greedy), not OpenAI's 1. ``/v1/completions``' ``max_tokens``: absent or null → 16 (OpenAI's).

Errors: :class:`RequestError` (HTTP status, offending field, message) rendered by :func:`error_body` as
``{"error": {"message", "type", "param", "code"}}`` (OpenAI's error object); :func:`validation_error` turns a
pydantic ``ValidationError`` into one, naming the first bad field (dotted path, e.g. ``messages.0.content``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class RequestError(Exception):
    """A request the server refuses: ``status`` (HTTP code), ``param`` (field name or None), ``message``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    """OpenAI-shaped error object ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


_TYPE_WORDS = {"str", "int", "float", "bool", "list", "dict", "none", "literal", "function-after", "tagged-union"}


def _path(loc) -> str:
    """Dotted field path of a pydantic error location, without the union-member tags pydantic inserts."""
    parts = []
    for p in loc:
        if isinstance(p, int):
            parts.append(str(p))
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", p) and p.lower() not in _TYPE_WORDS:
            parts.append(p)
    return ".".join(parts)


def validation_error(e: ValidationError, model: type[BaseModel]) -> RequestError:
    """400 :class:`RequestError` for the first invalid field of ``e`` (unknown fields list the accepted ones)."""
    err = e.errors()[0]
    path = _path(err["loc"])
    if err["type"] == "extra_forbidden":
        return RequestError(400, f"unknown field {path!r}; accepted fields: {', '.join(model.model_fields)}", path)
    if err["type"] == "missing":
        return RequestError(400, f"field {path!r} is required", path)
    got = repr(err.get("input"))
    got = got if len(got) <= 60 else got[:57] + "..."
    return RequestError(400, f"field {path!r}: {err['msg']} (got {got})", path)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    """A text content part (``{"type": "text", "text": ...}``) of an OpenAI chat message."""

    type: Literal["text"]
    text: str


class Message(_Strict):
    """A chat message; ``content`` a string or a list of text parts (joined). Roles the chat template knows."""

    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        """The message content as one string."""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class _DecoderOverrides(_Strict):
    threshold: float | None = Field(None, ge=0.0, le=1.0, description="commit threshold τ_mask")
    edit_threshold: float | None = Field(None, ge=0.0, le=1.0, description="edit threshold τ_edit")
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=0, le=2 ** 63 - 1, description="sampling seed (temperature > 0)")

    def stop_list(self) -> list[str]:
        """``stop`` as a list (OpenAI allows one string)."""
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        if len(stops) > 16:
            raise RequestError(400, f"field 'stop': at most 16 stop strings, got {len(stops)}", "stop")
        if any(s == "" for s in stops):
            raise RequestError(400, "field 'stop': stop strings must not be empty", "stop")
        if any(len(s) > 256 for s in stops):
            raise RequestError(400, "field 'stop': each stop string may have at most 256 characters", "stop")
        return stops


class GenerateRequest(_DecoderOverrides):
    """Body of ``POST /generate`` (module docstring)."""

    messages: list[Message] | None = None
    prompt: str | None = None
    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)  # as the OpenAI endpoints (1e400 parses to inf)
    stream: bool = True

    def prompt_or_messages(self) -> str | list[dict]:
        """The prompt string, or the messages as ``[{"role", "content"}]``; exactly one must be given."""
        if (self.messages is None) == (self.prompt is None):
            raise RequestError(400, "give exactly one of 'messages' (chat, template applied) or 'prompt' (text "
                                    "used as is)", "messages")
        if self.messages is not None:
            return _messages(self.messages)
        if not self.prompt:
            raise RequestError(400, "field 'prompt' is empty", "prompt")
        return self.prompt


class StreamOptions(_Strict):
    """OpenAI ``stream_options``: ``include_usage`` adds a last chunk with ``usage`` and no choices."""

    include_usage: bool = False


class _OpenAICommon(_DecoderOverrides):
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None

    def check_neutral(self) -> None:
        """Refuse OpenAI options the engine cannot honour unless at their neutral value."""
        neutral = {"n": (self.n, (None, 1), "only one choice per request is generated"),
                   "top_p": (self.top_p, (None, 1, 1.0), "the engine's decoders use no nucleus sampling"),
                   "presence_penalty": (self.presence_penalty, (None, 0, 0.0), "penalties are not implemented"),
                   "frequency_penalty": (self.frequency_penalty, (None, 0, 0.0), "penalties are not implemented"),
                   "logit_bias": (self.logit_bias or None, (None,), "logit bias is not implemented")}
        neutral.update(self._extra_neutral())
        for name, (value, ok, why) in neutral.items():
            if value not in ok:
                raise RequestError(400, f"field {name!r}={value!r} is not supported: {why}", name)
        if self.stream_options is not None and not self.stream:
            raise RequestError(400, "field 'stream_options' is only allowed with 'stream': true", "stream_options")

    def _extra_neutral(self) -> dict:
        return {}


class ChatRequest(_OpenAICommon):
    """Body of ``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None

    def _extra_neutral(self) -> dict:
        return {"logprobs": (self.logprobs, (None, False), "log-probabilities are not returned"),
                "top_logprobs": (self.top_logprobs, (None,), "log-probabilities are not returned")}

    def budget(self) -> int | None:
        """``max_completion_tokens`` (current name) or ``max_tokens`` (deprecated name); they must agree."""
        if self.max_completion_tokens is not None and self.max_tokens is not None \
                and self.max_completion_tokens != self.max_tokens:
            raise RequestError(400, "fields 'max_tokens' and 'max_completion_tokens' disagree; give one",
                               "max_completion_tokens")
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_OpenAICommon):
    """Body of ``POST /v1/completions`` (one text prompt, used as is; ``max_tokens`` defaults to OpenAI's 16)."""

    prompt: str | list[str]
    max_tokens: int | None = Field(16, ge=1)

    @field_validator("max_tokens")
    @classmethod
    def _null_is_default(cls, v):
        """``"max_tokens": null`` means the default (16), as leaving it out does — not "until EOS"."""
        return 16 if v is None else v
    echo: bool | None = None
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def _extra_neutral(self) -> dict:
        return {"echo": (self.echo, (None, False), "the prompt is not echoed"),
                "logprobs": (self.logprobs, (None,), "log-probabilities are not returned"),
                "best_of": (self.best_of, (None, 1), "only one candidate is generated"),
                "suffix": (self.suffix, (None,), "insertion (suffix) is not implemented")}

    def prompt_text(self) -> str:
        """The single prompt string (a list must hold exactly one)."""
        p = self.prompt
        if isinstance(p, list):
            if len(p) != 1:
                raise RequestError(400, f"field 'prompt': one prompt per request is supported, got a list of {len(p)}",
                                   "prompt")
            p = p[0]
        if not p:
            raise RequestError(400, "field 'prompt' is empty", "prompt")
        return p


def _messages(messages: list[Message]) -> list[dict]:
    if not messages:
        raise RequestError(400, "field 'messages' is an empty list; give at least one message", "messages")
    return [{"role": m.role, "content": m.text()} for m in messages]


def chat_messages(req: ChatRequest) -> list[dict]:
    """The chat request's messages as ``[{"role", "content"}]`` for the chat template."""
    return _messages(req.messages)
