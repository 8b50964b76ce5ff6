"""Pydantic models of the OpenAI requests osserve accepts (chat, completions, responses).

Responses are built as plain dicts in the handlers, in OpenAI's exact wire shape; requests are
validated here so every wrong type or range becomes a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from osserve.structured.requests import vllm_format


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown OpenAI fields are accepted and ignored


class FunctionDef(BaseModel):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(BaseModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"


class ChatToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # accepted as a synonym of `reasoning`
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str | None:
        if self.content is None or isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type in ("text", "input_text"))


class StreamOptions(BaseModel):
    include_usage: bool = False


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None


class SamplingFields(_Request):
    """Sampling fields shared by chat and completions (OpenAI's, plus vLLM's extensions)."""

    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=128)
    seed: int | None = None
    stop: str | list[str] | None = None
    frequency_penalty: float = Field(default=0.0, ge=-2, le=2)
    presence_penalty: float = Field(default=0.0, ge=-2, le=2)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM extensions
    top_k: int = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0, le=1)
    repetition_penalty: float = Field(default=1.0, gt=0)
    min_tokens: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    structured_outputs: dict[str, Any] | None = None  # {"json" | "regex" | "choice" | "grammar" | "json_object": ...}
    guided_json: dict[str, Any] | str | None = None  # vLLM's older spellings of structured_outputs
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def engine_extras(self) -> dict[str, Any]:
        """The fields that map one to one onto SamplingParams."""
        return {k: getattr(self, k) for k in ("top_k", "min_p", "repetition_penalty", "min_tokens", "ignore_eos",
                                              "frequency_penalty", "presence_penalty")}

    def vllm_format(self) -> tuple[dict[str, Any], str] | None:
        """The answer format from vLLM's structured_outputs or guided_* fields (400s name the field)."""
        return vllm_format(self.structured_outputs, {"guided_json": self.guided_json,
                                                     "guided_regex": self.guided_regex,
                                                     "guided_choice": self.guided_choice,
                                                     "guided_grammar": self.guided_grammar})

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatCompletionRequest(SamplingFields):
    model: str
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    include_reasoning: bool = True
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs: true")
        return self


class CompletionRequest(SamplingFields):
    model: str
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    suffix: str | None = None
    response_format: ResponseFormat | None = None  # vLLM's extension: the whole output follows it


class ResponsesRequest(_Request):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    reasoning: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    max_output_tokens: int | None = Field(default=None, ge=1)
    max_tool_calls: int | None = Field(default=None, ge=0, le=1000)  # the server's tool calls in one response
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False
    seed: int | None = None
    ignore_eos: bool = False
