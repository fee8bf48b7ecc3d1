"""What each service request runs on its worker thread: the backend's call between the wire's checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gmlx_server.auxiliary.audio_out import Encoder
from gmlx_server.auxiliary.audio_wire import SpeechRequest, TranscriptionRequest, transcription_body
from gmlx_server.auxiliary.embeddings import Embedder
from gmlx_server.auxiliary.embeddings_wire import (
    EmbeddingsRequest,
    check_dimensions,
    count_tokens,
    embeddings_response,
    sequences,
    shorten,
)
from gmlx_server.auxiliary.rerank import RerankRequest, cosine_scores, rerank_response
from gmlx_server.auxiliary.stt import Transcriber
from gmlx_server.auxiliary.tts import Speaker
from gmlx_server.config import ServiceEntry


def embed_job(req: EmbeddingsRequest, embedder: Embedder, entry: ServiceEntry) -> dict[str, Any]:
    width = check_dimensions(req, embedder.dimensions, bool(entry.options.get("matryoshka")))
    seqs = sequences(req, embedder)
    vectors = shorten(embedder.embed(seqs), width, embedder.normalize)
    return embeddings_response(vectors, req.encoding_format, entry.id, count_tokens(seqs))


def transcribe_job(req: TranscriptionRequest, task: str, max_s: float) -> Callable[[Transcriber], tuple[str, bytes]]:
    def run(model: Transcriber) -> tuple[str, bytes]:
        audio = model.decode(req.audio, max_s)
        found = model.transcribe(audio, task, req.language, req.prompt, req.temperature, req.words)
        return transcription_body(found, req, task)

    return run


def speech_job(req: SpeechRequest) -> Callable[[Speaker, Callable[[bytes], None]], None]:
    def run(voice: Speaker, emit: Callable[[bytes], None]) -> None:
        choice = voice.pick(req.voice)
        encoder = Encoder(req.response_format, voice.sample_rate)
        voice.synthesize(req.text, req.speed, choice, lambda pcm: emit(encoder.feed(pcm)))
        emit(encoder.finish())

    return run


def rerank_cosine_job(req: RerankRequest, model_id: str) -> Callable[[Embedder], dict[str, Any]]:
    def run(embedder: Embedder) -> dict[str, Any]:
        scores, tokens = cosine_scores(req, embedder)
        return rerank_response(req, scores, model_id, tokens)

    return run
