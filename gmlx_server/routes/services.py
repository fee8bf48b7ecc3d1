"""The service routes: embeddings, rerank, speech-to-text, text-to-speech, and systemone (never configured)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import falcon
import falcon.asgi

from gmlx_server.auxiliary.audio_out import CONTENT_TYPES
from gmlx_server.auxiliary.audio_wire import parse_form, parse_speech, parse_transcription
from gmlx_server.auxiliary.embeddings_wire import parse_embeddings
from gmlx_server.auxiliary.jobs import embed_job, rerank_cosine_job, speech_job, transcribe_job
from gmlx_server.auxiliary.llm_rerank import llm_scores
from gmlx_server.auxiliary.rerank import parse_rerank, rerank_response
from gmlx_server.auxiliary.service_errors import ServiceNotConfigured
from gmlx_server.auxiliary.service_host import ServiceHost, uses_chat_model
from gmlx_server.auxiliary.service_thread import Lease, Service
from gmlx_server.routes.common import GmlxRequest, body_of
from gmlx_server.routes.context import RawBody


class Addressed(Protocol):
    """A parsed service request: the model it names, if any."""

    @property
    def model(self) -> str | None: ...


R = TypeVar("R", bound=Addressed)
ROUTES = {"embeddings": "POST /v1/embeddings", "rerank": "POST /v1/rerank", "stt": "POST /v1/audio/transcriptions",
          "tts": "POST /v1/audio/speech"}


def body_bytes(req: GmlxRequest) -> int:
    return int(req.context.body_bytes or req.content_length or 0)


def lookup(services: ServiceHost, kind: str, route: str, parse: Callable[[Service], R]) -> tuple[Service, R]:
    """The route's service (404 when unconfigured), the request parsed with its limits, then its `model` checked."""
    svc = services.service(kind, route)
    parsed = parse(svc)
    services.service(kind, route, parsed.model)
    return svc, parsed


def send_json(resp: falcon.asgi.Response, lease: Lease, payload: dict[str, Any]) -> None:
    data = json.dumps(payload, ensure_ascii=False).encode()
    resp.content_type = falcon.MEDIA_JSON
    resp.data = data
    lease.finish(True, len(data))


class Embeddings:
    """POST /v1/embeddings (OpenAI)."""

    def __init__(self, services: ServiceHost) -> None:
        self.services = services

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        svc, parsed = lookup(self.services, "embeddings", ROUTES["embeddings"],
                             lambda s: parse_embeddings(body_of(req), int(s.entry.options["max_inputs"])))
        async with svc.admitted(body_bytes(req)) as lease:
            payload = await svc.call(lambda embedder: embed_job(parsed, embedder, svc.entry))
            send_json(resp, lease, payload)


class Rerank:
    """POST /v1/rerank and /rerank (Cohere/Jina): cosine on an embeddings model, or a chat model's yes/no."""

    def __init__(self, services: ServiceHost) -> None:
        self.services = services

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        svc, parsed = lookup(self.services, "rerank", ROUTES["rerank"],
                             lambda s: parse_rerank(body_of(req), int(s.entry.options["max_documents"])))
        async with svc.admitted(body_bytes(req)) as lease:
            if uses_chat_model(svc.entry) and self.services.chat is not None and svc.entry.model is not None:
                scores, tokens = await llm_scores(self.services.chat, svc.entry.model, parsed)
                payload = rerank_response(parsed, scores, svc.entry.id, tokens)
            else:
                worker = self.services.embedder_service(svc)
                payload = await worker.call(rerank_cosine_job(parsed, svc.entry.id))
            send_json(resp, lease, payload)


class Transcriptions(RawBody):
    """POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's multipart form (the body middleware
    hands over the bytes instead of parsing JSON)."""

    def __init__(self, services: ServiceHost, task: str) -> None:
        self.services, self.task = services, task

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        raw = req.context.raw_body
        svc, parsed = lookup(self.services, "stt", f"POST {req.path}", lambda s: parse_transcription(
            parse_form(req.content_type, raw), int(s.entry.options["max_file_bytes"])))
        async with svc.admitted(body_bytes(req)) as lease:
            job = transcribe_job(parsed, self.task, float(svc.entry.options["max_audio_s"]))
            content_type, data = await svc.call(job)
            resp.content_type, resp.data = content_type, data
            lease.finish(True, len(data))


class Speech:
    """POST /v1/audio/speech: streamed as the voice speaks each sentence."""

    def __init__(self, services: ServiceHost) -> None:
        self.services = services

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        svc, parsed = lookup(self.services, "tts", ROUTES["tts"],
                             lambda s: parse_speech(body_of(req), int(s.entry.options["max_input_chars"])))
        lease = svc.admit(body_bytes(req))
        chunks = svc.stream(speech_job(parsed))
        try:
            first = await anext(chunks, b"")  # a failure before any audio is still a typed error response
        except BaseException:
            lease.finish(False)
            raise
        resp.content_type = CONTENT_TYPES[parsed.response_format]
        resp.stream = _relay(first, chunks, lease)


async def _relay(first: bytes, chunks: AsyncIterator[bytes], lease: Lease) -> AsyncIterator[bytes]:
    sent, ok = len(first), False
    try:
        yield first
        async for chunk in chunks:
            sent += len(chunk)
            yield chunk
        ok = True
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]
        lease.finish(ok, sent)


class SystemOne:
    """POST /v1/systemone: structured decisions from a DiffusionGemma model, which this build cannot serve."""

    async def on_post(self, req: GmlxRequest, resp: falcon.asgi.Response) -> None:
        raise ServiceNotConfigured(f"POST {req.path}", "systemone", buildable=False)
