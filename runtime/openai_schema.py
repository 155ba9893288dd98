"""The OpenAI request bodies ``rapid edge`` accepts, and what it refuses (pydantic models).

Honoured: ``model`` (must be the served model name), ``prompt`` (a string, one string in a
list, or token ids) / ``messages`` (roles and text content), ``max_tokens`` /
``max_completion_tokens`` (default: the daemon's ``--max-tokens``, else until EOS or the
context limit), ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop`` (up to 4 strings),
``stream``, ``stream_options.include_usage``, ``n`` = 1, log-probabilities (completions
``logprobs`` 0..5; chat ``logprobs: true`` with ``top_logprobs`` 0..20, which needs
``logprobs: true``; exact: the target's, computed by the cloud, ``rapid.runtime.openai_logprobs``),
and fields without effect on the output (``user``, ``metadata``, ``store``, ``service_tier``).

Refused with 400 naming the parameter (never silently ignored): ``n`` > 1, ``best_of`` > 1,
non-zero ``presence_penalty`` / ``frequency_penalty``, a non-empty ``logit_bias``, ``echo``,
``suffix``, ``tools`` / ``tool_choice`` / ``functions`` /
``function_call``, a ``response_format`` other than text, and any field not listed here. The
penalties and biases change the target's picks (they would have to be applied on the cloud):
they are not implemented, so asking for them is an error. Types are strict, as the published
schema says (``/openapi.json``, ``rapid.runtime.openapi_doc``): ``"max_tokens": "5"`` or a prompt of
``[true, false]`` is a 400, not silently read as 5 or as token ids [1, 0] (the API fuzz found that).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rapid.core.errors import RapidError


class ApiError(RapidError):
    """A request the API answers with an OpenAI-shaped error body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code


MAX_TOP_K = 2**31 - 1  # what the wire carries (a larger one overflowed msgpack: 502, found by the API fuzz)


@dataclass(slots=True, frozen=True)
class RequestDefaults:
    """The daemon's own flags, used where a request leaves a parameter out."""

    max_tokens: int | None = None  # None: until EOS or the context limit
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None  # None: a random seed per sampled request (OpenAI semantics)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=MAX_TOP_K)  # above the vocabulary: every token kept
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1)
    best_of: int | None = Field(None, ge=1)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None


class CompletionBody(_Body):
    prompt: str | list[str] | list[int]
    logprobs: int | None = Field(None, ge=0, le=5)  # OpenAI's legacy limit
    echo: bool | None = None
    suffix: str | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatBody(_Body):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)  # OpenAI's limit (= rapid.core.wire.MAX_TOP_LOGPROBS)
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None


_UNSUPPORTED = {  # parameter → (is it set to something we would have to honour?, why refused)
    "n": (lambda v: v not in (None, 1), "only n = 1 is supported"),
    "best_of": (lambda v: v not in (None, 1), "best_of > 1 is not supported"),
    "presence_penalty": (lambda v: bool(v), "presence_penalty is not supported (it would change the target's picks)"),
    "frequency_penalty": (lambda v: bool(v), "frequency_penalty is not supported (it would change the target's picks)"),
    "logit_bias": (lambda v: bool(v), "logit_bias is not supported (it would change the target's picks)"),
    "echo": (lambda v: bool(v), "echo is not supported"),
    "suffix": (lambda v: bool(v), "suffix (insertion) is not supported"),
    "tools": (lambda v: bool(v), "tool calling is not supported"),
    "functions": (lambda v: bool(v), "function calling is not supported"),
    "tool_choice": (lambda v: v not in (None, "none"), "tool calling is not supported"),
    "function_call": (lambda v: v not in (None, "none"), "function calling is not supported"),
    "response_format": (lambda v: v not in (None, {"type": "text"}), "only response_format {\"type\": \"text\"} is supported"),
}


def _refuse_unsupported(body: _Body) -> None:
    for name, (is_set, why) in _UNSUPPORTED.items():
        if is_set(getattr(body, name, None)):
            raise ApiError(400, why, name)


def parse_body(raw: Any, chat: bool, served_model: str) -> CompletionBody | ChatBody:
    """Validate a request body (see the module docstring); ``ApiError`` says what is wrong."""
    if not isinstance(raw, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        body = (ChatBody if chat else CompletionBody).model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        param = ".".join(str(x) for x in err["loc"]) or None
        if err["type"] == "extra_forbidden":
            raise ApiError(400, f"unrecognized request argument: {param}", param) from None
        raise ApiError(400, f"{param}: {err['msg']}", param) from None
    _refuse_unsupported(body)
    if isinstance(body, ChatBody) and body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs requires logprobs: true", "top_logprobs")
    if body.model is not None and body.model != served_model:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {served_model!r}",
                       "model", code="model_not_found")
    return body


def stop_strings(body: _Body) -> list[str]:
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stop) > 4:
        raise ApiError(400, "stop: at most 4 stop strings", "stop")
    return stop


def sampling_of(body: _Body, defaults: RequestDefaults) -> tuple[float, float, int, int]:
    """(temperature, top_p, top_k, seed): the request's, else the daemon's defaults."""
    temperature = defaults.temperature if body.temperature is None else body.temperature
    top_p = defaults.top_p if body.top_p is None else body.top_p
    top_k = defaults.top_k if body.top_k is None else body.top_k
    seed = body.seed if body.seed is not None else defaults.seed
    if seed is None:
        seed = secrets.randbits(31) if temperature > 0 else 0
    return temperature, top_p, top_k, int(seed) & 0x7FFFFFFF


def max_tokens_of(body: _Body, defaults: RequestDefaults) -> int | None:
    """The request's ``max_tokens`` (or ``max_completion_tokens``), else the daemon's; None =
    until EOS or the context limit."""
    explicit = getattr(body, "max_completion_tokens", None) or body.max_tokens
    return explicit if explicit is not None else defaults.max_tokens


def logprobs_of(body: _Body) -> int:
    """-1: no log-probabilities; k >= 0: each token's and its top k (completions ``logprobs``;
    chat ``top_logprobs`` when ``logprobs`` is true, else 0)."""
    if isinstance(body, ChatBody):
        return (body.top_logprobs or 0) if body.logprobs else -1
    return -1 if getattr(body, "logprobs", None) is None else body.logprobs
