"""The server's routes as an OpenAPI 3.1 document (served at GET /openapi.json).

Request bodies follow the parsers: the sampling fields and their ranges come from the knob table the
parsers read (config/sampling.py), so the document and the validation cannot drift; a test keeps the paths
equal to the app's route table.
Unknown fields are accepted everywhere (additionalProperties), as the parsers accept them.
"""

from __future__ import annotations

from typing import Any

from gmlx_server.config import SAMPLING_KNOBS
from gmlx_server.protocol.anthropic import STOP_SEQUENCES_LIMIT
from gmlx_server.protocol.jsonsafe import MAX_DEPTH
from gmlx_server.protocol.lifetime import PATTERN as DURATION_PATTERN
from gmlx_server.protocol.openapi_services import service_paths, service_schemas
from gmlx_server.protocol.output_fields import FORMAT_TYPES, MAX_CHOICES, MAX_GRAMMAR_CHARS
from gmlx_server.protocol.tokenization_wire import MAX_TOKEN_IDS

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
BOOL: Schema = {"type": "boolean"}
OBJECT: Schema = {"type": "object"}
TOKENS: Schema = {"type": "integer", "minimum": 1}
EFFORTS = ["none", "minimal", "low", "medium", "high", "xhigh"]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def obj(required: tuple[str, ...] = (), **props: Schema) -> Schema:
    out: Schema = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    return out


def one_of(*schemas: Schema) -> Schema:
    return {"oneOf": list(schemas)}


def array(items: Schema, **kw: Any) -> Schema:
    return {"type": "array", "items": items, **kw}


def _sampling() -> dict[str, Schema]:
    out: dict[str, Schema] = {}
    for name, knob in SAMPLING_KNOBS.items():
        if knob.kind == "boolean":
            out[name] = BOOL
        elif knob.kind == "integer":
            out[name] = {"type": "integer", "minimum": int(knob.lo), "maximum": int(knob.hi)}
        else:
            bound = {"exclusiveMinimum": knob.lo} if knob.lo_open else {"minimum": knob.lo}
            out[name] = {"type": "number", **bound, "maximum": knob.hi}
    return out


def _generation(**props: Schema) -> dict[str, Schema]:
    """What every generation route reads alike (params.generation_basics, the structured-output aliases), plus
    the route's own fields."""
    return {"model": STRING, "profile": STRING, "stream": BOOL, "logit_bias": ref("LogitBias"), **_sampling(),
            "chat_template_kwargs": OBJECT, "priority": PRIORITY, **LIFETIME,
            "structured_outputs": obj(json=one_of(OBJECT, STRING), json_object={"enum": [True]}, regex=GRAMMAR,
                                      choice=CHOICES, grammar=GRAMMAR),
            "grammar": GRAMMAR, **props}


def _format(**schema: Schema) -> Schema:
    """A route's format object: `schema` says where its JSON schema sits (OpenAI nests it under json_schema)."""
    return obj(("type",), type={"enum": list(FORMAT_TYPES)}, regex=GRAMMAR, choice=CHOICES, grammar=GRAMMAR,
               **schema)


def _thinking() -> dict[str, Schema]:
    return {"reasoning": obj(effort={"enum": EFFORTS}, max_tokens={"type": "integer", "minimum": 0},
                             enabled=BOOL),
            "reasoning_effort": {"enum": EFFORTS}, "enable_thinking": BOOL,
            "thinking_budget": {"type": "integer", "minimum": -1}}


DETAIL = {"enum": ["auto", "low", "high"]}
GRAMMAR: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_GRAMMAR_CHARS}  # a regex, Lark or GBNF
CHOICES: Schema = array({"type": "string", "minLength": 1}, minItems=1, maxItems=MAX_CHOICES)
# keep_alive (Ollama) or ttl (LM Studio), not both: seconds or a Go duration; negative: no end, 0: unload after
DURATION = one_of({"type": "number"}, {"type": "string", "pattern": DURATION_PATTERN})
LIFETIME: dict[str, Schema] = {"keep_alive": DURATION, "ttl": DURATION}
PRIORITY = one_of({"enum": ["interactive", "normal", "batch"]}, {"type": "integer", "minimum": -1000, "maximum": 1000})


def _chat_message() -> Schema:
    image = one_of(STRING, obj(("url",), url=STRING, detail=DETAIL))  # an http(s) URL or a base64 data: URI
    part = obj(("type",), type={"enum": ["text", "image_url"]}, text=STRING, image_url=image)
    call = obj(("function",), id=STRING, type={"enum": ["function"]},
               function=obj(name=STRING, arguments=one_of(STRING, OBJECT)))
    return obj(("role",), role={"enum": ["system", "developer", "user", "assistant", "tool", "function"]},
               content=one_of(STRING, array(part), {"type": "null"}), name=STRING, tool_call_id=STRING,
               tool_calls=array(call), reasoning_content=STRING, reasoning=STRING)


def _chat_prompt() -> dict[str, Schema]:
    """The fields a chat prompt is rendered from (protocol.openai.chat_prompt): chat and the tokenizer routes."""
    tool = obj(("type", "function"), type={"enum": ["function"]},
               function=obj(("name",), name=STRING, description=STRING, parameters=OBJECT))
    choice = one_of({"enum": ["none", "auto", "required"]}, obj(("type", "function"), type={"enum": ["function"]},
                                                                 function=obj(("name",), name=STRING)))
    return {"messages": array(ref("ChatMessage"), minItems=1), "tools": array(tool), "tool_choice": choice,
            "chat_template_kwargs": OBJECT, **_thinking()}


def _chat() -> Schema:
    return obj(("messages",), **_generation(
        **_chat_prompt(), parallel_tool_calls=BOOL,
        response_format=ref("ResponseFormat"), stream_options=obj(include_usage=BOOL), stop=ref("Stop"),
        max_tokens=TOKENS, max_completion_tokens=TOKENS, max_output_tokens=TOKENS,
        logprobs=BOOL, top_logprobs={"type": "integer", "minimum": 0, "maximum": 20},
        timings_per_token=BOOL, dry_run=BOOL))


def _tokenizer_schemas() -> dict[str, Schema]:
    """llama-server's and vLLM's tokenizer bodies (protocol.tokenization_wire): text, or a chat prompt."""
    target = {"model": STRING, "profile": STRING}
    chat = {**target, **_chat_prompt(), "add_generation_prompt": BOOL}
    ids = array({"type": "integer", "minimum": 0}, maxItems=MAX_TOKEN_IDS)
    return {
        "TokenizeRequest": obj((), **chat, content=STRING, prompt=STRING, add_special=BOOL, add_special_tokens=BOOL,
                               with_pieces=BOOL, return_token_strs=BOOL),
        "DetokenizeRequest": obj(("tokens",), **target, tokens=ids),
        "ApplyTemplateRequest": obj(("messages",), **chat),
    }


def _tokenizer_paths() -> Schema:
    ops = {"/tokenize": _post("Token ids of a text or of a chat prompt (llama-server, vLLM)", "TokenizeRequest"),
           "/detokenize": _post("The text of token ids", "DetokenizeRequest"),
           "/apply-template": _post("A chat prompt as the model's template renders it", "ApplyTemplateRequest")}
    return {prefix + path: {"post": op} for path, op in ops.items() for prefix in ("", "/v1")}


def _completion() -> Schema:
    return obj(("prompt",), **_generation(
        prompt=STRING, response_format=ref("ResponseFormat"), max_tokens=TOKENS, max_output_tokens=TOKENS,
        stop=ref("Stop"),
        stream_options=obj(include_usage=BOOL), n={"type": "integer", "minimum": 1, "maximum": 1},
        best_of={"type": "integer", "minimum": 1, "maximum": 1}, echo={"enum": [False]}, suffix={"enum": [""]}))


def _anthropic_block() -> Schema:
    kinds = ["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"]
    source = obj(("type",), type={"enum": ["base64", "url"]}, media_type=STRING, data=STRING, url=STRING)
    return obj(("type",), type={"enum": kinds}, text=STRING, source=source, id=STRING, name=STRING, input=OBJECT,
               tool_use_id=STRING, content=one_of(STRING, array(obj(("type", "text"), type={"enum": ["text"]},
                                                                     text=STRING))),
               is_error=BOOL, thinking=STRING, signature=STRING, data=STRING)


def _messages() -> Schema:
    msg = obj(("role", "content"), role={"enum": ["user", "assistant", "system"]},
              content=one_of(STRING, array(ref("AnthropicBlock"))))
    tool = obj(("name",), name=STRING, description=STRING, input_schema=OBJECT)
    choice = obj(("type",), type={"enum": ["auto", "any", "tool", "none"]}, name=STRING,
                 disable_parallel_tool_use=BOOL)
    return obj(("messages",), **_generation(
        messages=array(msg, minItems=1), system=one_of(STRING, array(obj(("type", "text"), type={"enum": ["text"]},
                                                                          text=STRING))),
        tools=array(tool), tool_choice=choice, max_tokens=TOKENS, max_output_tokens=TOKENS,
        stop_sequences=array(STRING, maxItems=STOP_SEQUENCES_LIMIT),
        thinking=obj(("type",), type={"enum": ["enabled", "disabled", "adaptive"]},
                     budget_tokens={"type": "integer", "minimum": 0}),
        output_config=obj(effort=STRING, format=_format(schema=OBJECT)), response_format=ref("ResponseFormat"),
        metadata=OBJECT, **_thinking()))


def _responses() -> Schema:
    kinds = ["input_text", "output_text", "text", "refusal", "input_image", "reasoning_text"]
    part = obj(("type",), type={"enum": kinds}, text=STRING, refusal=STRING, image_url=STRING, detail=DETAIL)
    content = one_of(STRING, array(part))
    summary = array(obj(("type", "text"), type={"enum": ["summary_text"]}, text=STRING))
    item = obj(type={"enum": ["message", "function_call", "function_call_output", "reasoning"]},
               role={"enum": ["user", "assistant", "system", "developer"]}, content=content,
               call_id=STRING, name=STRING, arguments=STRING, output=content, summary=summary,
               encrypted_content=STRING)
    tool = obj(("type",), type=STRING, name=STRING, description=STRING, parameters=OBJECT)
    choice = one_of({"enum": ["none", "auto", "required"]}, obj(("type", "name"), type={"enum": ["function"]},
                                                                 name=STRING))
    fmt = _format(name=STRING, schema=OBJECT)
    return obj(("input",), **_generation(
        input=one_of(STRING, array(item, minItems=1)), instructions=STRING, tools=array(tool), tool_choice=choice,
        parallel_tool_calls=BOOL, text=obj(format=fmt), response_format=ref("ResponseFormat"),
        max_output_tokens=TOKENS, max_tokens=TOKENS, store=BOOL,
        previous_response_id=STRING, metadata=OBJECT, **_thinking()))


def _errors() -> dict[str, Schema]:
    openai = obj(("error",), error={**obj(("message", "type", "param", "code"), message=STRING, type=STRING,
                                          param={"type": ["string", "null"]}, code={"type": ["string", "null"]})})
    anthropic = obj(("type", "error"), type={"enum": ["error"]},
                    error=obj(("type", "message"), type=STRING, message=STRING))
    return {"OpenAIError": openai, "AnthropicError": anthropic}


def _components() -> Schema:
    return {
        "schemas": {
            "ChatRequest": _chat(), "CompletionRequest": _completion(), "MessagesRequest": _messages(),
            "ResponsesRequest": _responses(), "ChatMessage": _chat_message(), "AnthropicBlock": _anthropic_block(),
            "ModelRequest": obj(model=STRING, keep=BOOL, warm=BOOL, keep_alive=DURATION, ttl=DURATION),
            "CacheResetRequest": obj(model=STRING, tier={"type": "string", "enum": ["ram", "disk"]}),
            "ResponseFormat": _format(json_schema=obj(("schema",), name=STRING, schema=OBJECT, strict=BOOL)),
            "Stop": one_of(STRING, array(STRING, maxItems=16)),
            "LogitBias": {"type": "object", "propertyNames": {"pattern": "^[0-9]+$"},
                          "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
            **_errors(), **service_schemas(), **_tokenizer_schemas(),
        },
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}},
    }


def _responses_of(ok: Schema, anthropic: bool = False, stream: bool = False) -> Schema:
    error = {"application/json": {"schema": ref("AnthropicError" if anthropic else "OpenAIError")}}
    content: Schema = {"application/json": {"schema": ok}}
    if stream:
        content["text/event-stream"] = {"schema": obj(("data",), data=STRING, event=STRING)}  # one event
    return {"200": {"description": "OK", "content": content},
            "4XX": {"description": "A typed client error", "content": error},
            "503": {"description": "Busy, loading or restarting: retry after Retry-After", "content": error}}


def _post(summary: str, body: str, *, required: bool = True, anthropic: bool = False, stream: bool = False,
          ) -> Schema:
    return {"summary": summary, "requestBody": {"required": required, "content": {
        "application/json": {"schema": ref(body)}}}, "responses": _responses_of(OBJECT, anthropic, stream)}


def _get(summary: str, *params: Schema, text: bool = False) -> Schema:
    op: Schema = {"summary": summary, "responses": _responses_of(OBJECT)}
    if text:
        op["responses"]["200"]["content"]["text/plain"] = {"schema": STRING}
    if params:
        op["parameters"] = list(params)
    return op


def _query(name: str, schema: Schema, required: bool = False) -> Schema:
    return {"name": name, "in": "query", "required": required, "schema": schema}


def _paths() -> Schema:
    metrics = {"get": _get("Server metrics (JSON, or Prometheus text with format=prometheus)",
                           _query("format", {"enum": ["json", "prometheus"]}), text=True)}
    models = {"get": _get("The configured models")}
    health = _get("Liveness; with ready=1, readiness (503 and a reason when not ready)",
                  _query("ready", {"enum": ["0", "1", "true", "false"]}))
    health["responses"]["503"] = {"description": "Not ready", "content": {"application/json": {"schema": OBJECT}}}
    return {
        "/v1/chat/completions": {"post": _post("OpenAI chat completion", "ChatRequest", stream=True)},
        "/v1/completions": {"post": _post("OpenAI text completion", "CompletionRequest", stream=True)},
        "/v1/messages": {"post": _post("Anthropic message", "MessagesRequest", anthropic=True, stream=True)},
        "/v1/messages/count_tokens": {"post": _post("Anthropic token count", "MessagesRequest", anthropic=True)},
        "/v1/responses": {"post": _post("OpenAI Responses", "ResponsesRequest", stream=True)},
        "/v1/estimate": {"post": _post("Estimate memory and time for a chat request", "ChatRequest")},
        "/unload": {"post": _post("Unload a model (or every idle one)", "ModelRequest", required=False)},
        "/v1/keep": {"post": _post("Keep a model resident and warm it", "ModelRequest", required=False)},
        "/v1/reload": {"post": {"summary": "Re-read the config file", "responses": _responses_of(OBJECT)}},
        "/v1/cache/reset": {"post": _post("Empty the prompt cache", "CacheResetRequest", required=False)},
        "/v1/cache/stats": {"get": _get("Prompt cache statistics")},
        "/v1/capacity/plan": {"get": _get("Do W streams at D tokens fit?",
                                          _query("width", TOKENS, True), _query("depth", TOKENS, True),
                                          _query("key", STRING, False))},
        "/v1/models": models, "/models": models,
        "/v1/models/{model_id}": {"get": {**_get("One model"), "parameters": [
            {"name": "model_id", "in": "path", "required": True, "schema": STRING}]}},
        "/health": {"get": health, "head": {**health, "responses": {  # as GET, without a body
            status: {"description": r["description"]} for status, r in health["responses"].items()}}},
        "/v1/metrics": metrics, "/metrics": metrics,
        "/openapi.json": {"get": _get("This document")},
        "/": {"get": _get("The server's name, version and links"), "head": _get("As GET, without a body")},
        **service_paths(), **_tokenizer_paths(),
    }


def document(version: str) -> Schema:
    """The OpenAPI 3.1 description of every route (security applies when server.api_key is set)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "gmlx", "version": version,
                 "description": "Local GGUF models over the OpenAI and Anthropic protocols. Request bodies are "
                                f"JSON objects nested at most {MAX_DEPTH} levels deep."},
        "paths": _paths(),
        "components": _components(),
        "security": [{"bearer": []}, {"apiKey": []}, {}],
    }
