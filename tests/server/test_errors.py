"""Bad input gets an OpenAI-style error body with the right status, never a 500."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from osserve.errors import OverloadedError
from osserve.server.app import ServerConfig, create_app
from osserve.tokenizer import load_tokenizer
from tests.server.serving import serve
from tests.server.stub_engine import ScriptedEngine

CHAT = "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    engine = ScriptedEngine(load_tokenizer().encode("fine"), max_model_len=1000)
    with serve(create_app(engine, load_tokenizer(), ServerConfig(model_name="m", max_body_bytes=100_000))) as url:
        yield url


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "m", "messages": OK_MSG, "temperature": "hot"}, 400, "temperature"),
    ({"model": "m", "messages": OK_MSG, "top_p": 2}, 400, "top_p"),
    ({"model": "m", "messages": OK_MSG, "n": 0}, 400, "n"),
    ({"model": "m", "messages": OK_MSG, "max_tokens": -1}, 400, "max_tokens"),
    ({"model": "m", "messages": OK_MSG, "top_k": -5}, 400, "top_k"),
    ({"model": "m", "messages": "hi"}, 400, "messages"),
    ({"model": "m"}, 400, "messages"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"model": "other", "messages": OK_MSG}, 404, "model"),
    ({"model": "m", "messages": OK_MSG, "max_tokens": 5000}, 400, "max_tokens"),
    ({"model": "m", "messages": OK_MSG, "response_format": {"type": "json_schema",
                                                            "json_schema": {"name": "x", "strict": True}}},
     400, "response_format.json_schema.schema"),
    ({"model": "m", "messages": OK_MSG, "tools": [], "tool_choice": "required"}, 400, "tool_choice"),
])
def test_chat_errors(base: str, body: dict, status: int, param: str) -> None:
    r = httpx.post(base + CHAT, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
FILE = {"type": "file", "file": {"file_id": "file-abc"}}


@pytest.mark.parametrize("part", [IMAGE, AUDIO, FILE, {"type": "video"}])
def test_chat_content_the_model_cannot_read_is_refused(base: str, part: dict) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]}]
    r = httpx.post(base + CHAT, json={"model": "m", "messages": messages})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[1].content[1]" and repr(part["type"]) in err["message"]


@pytest.mark.parametrize("part", [{"type": "input_image", "image_url": "https://example.com/a.png"},
                                  {"type": "input_file", "file_id": "file-abc"},
                                  {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}])
def test_responses_content_the_model_cannot_read_is_refused(base: str, part: dict) -> None:
    items = [{"type": "message", "role": "user", "content": "hi"},
             {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is this?"}, part]}]
    r = httpx.post(base + "/v1/responses", json={"model": "m", "input": items})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input[1].content[1]" and repr(part["type"]) in err["message"]


def test_text_parts_are_read() -> None:
    """Text parts (and an assistant's refusal part) reach the prompt; nothing is dropped."""
    engine = ScriptedEngine(load_tokenizer().encode("fine"))
    tok = load_tokenizer()
    with serve(create_app(engine, tok, ServerConfig(model_name="m"))) as url:
        messages = [{"role": "user", "content": [{"type": "text", "text": "alpha "}, {"type": "text", "text": "beta"}]},
                    {"role": "assistant", "content": [{"type": "refusal", "refusal": "gamma"}]},
                    {"role": "user", "content": "delta"}]
        assert httpx.post(url + CHAT, json={"model": "m", "messages": messages}).status_code == 200
        items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "epsilon"}]},
                 {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "zeta"}]},
                 {"type": "message", "role": "user", "content": "eta"}]
        assert httpx.post(url + "/v1/responses", json={"model": "m", "input": items}).status_code == 200
    chat, responses = (tok.decode(p) for p in engine.prompts)
    assert all(w in chat for w in ("alpha beta", "gamma", "delta"))
    assert all(w in responses for w in ("epsilon", "zeta", "eta"))


def test_invalid_json_and_body_limit(base: str) -> None:
    r = httpx.post(base + CHAT, content=b'{"model": ', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    r = httpx.post(base + CHAT, json={"model": "m", "messages": [{"role": "user", "content": "x" * 200_000}]})
    assert r.status_code == 413


def test_other_routes_errors(base: str) -> None:
    assert httpx.post(base + "/v1/completions", json={"model": "m", "prompt": [[1], [2]]}).status_code == 400
    assert httpx.post(base + "/v1/responses", json={"model": "m", "input": "x",
                                                    "previous_response_id": "resp_nope"}).status_code == 400
    assert httpx.get(base + "/v1/responses/resp_nope").status_code == 404
    r = httpx.post(base + "/v1/responses", json={"model": "m", "input": "x", "reasoning": {"effort": "extreme"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "reasoning.effort"
    assert httpx.post(base + "/api/chat", json={"model": "m", "messages": [],
                                                "options": {"temperature": -1}}).status_code == 400
    assert httpx.get(base + "/health").status_code == 200


def test_api_key() -> None:
    engine = ScriptedEngine(load_tokenizer().encode("ok"))
    with serve(create_app(engine, load_tokenizer(), ServerConfig(model_name="m", api_key="sekret"))) as url:
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = httpx.get(url + "/v1/models", headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200 and ok.json()["data"][0]["id"] == "m"
        assert httpx.get(url + "/health").status_code == 200


class _Overloaded(ScriptedEngine):
    async def generate(self, prompt_token_ids, params, request_id):  # type: ignore[no-untyped-def,override]
        raise OverloadedError("the server is overloaded")
        yield  # pragma: no cover


def test_overload_is_503_with_retry_after() -> None:
    with serve(create_app(_Overloaded(), load_tokenizer(), ServerConfig(model_name="m"))) as url:
        r = httpx.post(url + CHAT, json={"model": "m", "messages": OK_MSG})
        assert r.status_code == 503 and r.headers["retry-after"] == "1"


@pytest.mark.parametrize(("body", "code"), [
    ({"model": "m"}, "missing_required_parameter"),
    ({"model": "m", "messages": OK_MSG, "temperature": "hot"}, "invalid_type"),
    ({"model": "m", "messages": OK_MSG, "top_p": 2}, "invalid_value"),
    ({"model": "m", "messages": OK_MSG, "max_tokens": 5000}, "context_length_exceeded"),
    ({"model": "other", "messages": OK_MSG}, "model_not_found"),
])
def test_error_codes_are_openai_strings(base: str, body: dict, code: str) -> None:
    assert httpx.post(base + CHAT, json=body).json()["error"]["code"] == code


def test_unknown_route_and_stored_response(base: str) -> None:
    r = httpx.get(base + "/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"
    r = httpx.get(base + "/v1/responses/resp_nope")
    assert r.status_code == 404 and r.json()["error"]["code"] is None  # a missing response is no missing model
