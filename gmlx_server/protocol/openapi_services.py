"""The service routes in /openapi.json: embeddings, rerank, the audio routes and systemone."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]
_STR: Schema = {"type": "string"}
_ERROR: Schema = {"application/json": {"schema": {"$ref": "#/components/schemas/OpenAIError"}}}
_INPUT: Schema = {"oneOf": [_STR, {"type": "array", "items": _STR},
                            {"type": "array", "items": {"type": "integer", "minimum": 0}},
                            {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}}]}
_SPEECH_FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]
_AUDIO_TYPES = ["audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm"]


def service_schemas() -> dict[str, Schema]:
    return {
        "EmbeddingsRequest": {"type": "object", "required": ["input"], "properties": {
            "model": _STR, "input": _INPUT, "encoding_format": {"enum": ["float", "base64"]},
            "dimensions": {"type": "integer", "minimum": 1}, "truncate": {"type": "boolean"}}},
        "RerankRequest": {"type": "object", "required": ["query", "documents"], "properties": {
            "model": _STR, "query": _STR, "top_n": {"type": "integer", "minimum": 1},
            "return_documents": {"type": "boolean"}, "documents": {"type": "array", "items": {"oneOf": [
                _STR, {"type": "object", "required": ["text"], "properties": {"text": _STR}}]}}}},
        "SpeechRequest": {"type": "object", "required": ["input"], "properties": {
            "model": _STR, "input": _STR, "voice": _STR, "response_format": {"enum": _SPEECH_FORMATS},
            "speed": {"type": "number", "minimum": 0.25, "maximum": 4.0}}},
        "TranscriptionForm": {"type": "object", "required": ["file"], "properties": {
            "file": {"type": "string", "contentMediaType": "application/octet-stream"}, "model": _STR,
            "language": _STR, "prompt": _STR, "temperature": {"type": "number", "minimum": 0, "maximum": 1},
            "response_format": {"enum": ["json", "text", "srt", "verbose_json", "vtt"]},
            "timestamp_granularities[]": {"type": "array", "items": {"enum": ["segment", "word"]}}}},
    }


def _responses(ok: Schema) -> Schema:
    return {"200": {"description": "OK", "content": ok},
            "4XX": {"description": "A typed client error (404 service_not_configured names the config key)",
                    "content": _ERROR},
            "501": {"description": "The services extra is not installed", "content": _ERROR},
            "503": {"description": "Busy, downloading or unavailable: see the error type", "content": _ERROR}}


def _op(summary: str, schema: str, ok: Schema, media: str = "application/json") -> Schema:
    return {"post": {"summary": summary, "responses": _responses(ok), "requestBody": {
        "required": True, "content": {media: {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}}}


def service_paths() -> Schema:
    json_ok = {"application/json": {"schema": {"type": "object"}}}
    text_ok = {**json_ok, "text/plain": {"schema": _STR}, "text/vtt": {"schema": _STR}}
    audio_ok = {t: {"schema": _STR} for t in _AUDIO_TYPES}
    rerank = _op("Rerank documents against a query (Cohere/Jina shape)", "RerankRequest", json_ok)
    systemone = {"post": {"summary": "Structured decisions from a DiffusionGemma model (not available)",
                          "responses": _responses(json_ok)}}
    return {
        "/v1/embeddings": _op("OpenAI embeddings", "EmbeddingsRequest", json_ok),
        "/v1/rerank": rerank, "/rerank": rerank,
        "/v1/audio/transcriptions": _op("OpenAI transcription", "TranscriptionForm", text_ok, "multipart/form-data"),
        "/v1/audio/translations": _op("OpenAI translation to English", "TranscriptionForm", text_ok,
                                      "multipart/form-data"),
        "/v1/audio/speech": _op("OpenAI text to speech", "SpeechRequest", audio_ok),
        "/v1/systemone": systemone, "/systemone": systemone,
    }
