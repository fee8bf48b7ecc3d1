"""Speech encoders: 16-bit mono PCM in, the response format's bytes out, chunk by chunk so speech streams.

wav carries the streaming sizes (0xFFFFFFFF) that decoders read to the end of; pcm is OpenAI's raw 24 kHz
16-bit little-endian; mp3, opus (in Ogg), aac (ADTS) and flac go through PyAV's encoders.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

PCM_RATE = 24_000  # OpenAI's pcm format
# format -> (PyAV container, codec, content type, encoder rate or None for the voice's own)
CODECS: dict[str, tuple[str, str, str, int | None]] = {
    "mp3": ("mp3", "libmp3lame", "audio/mpeg", None),
    "opus": ("ogg", "libopus", "audio/ogg", 24_000),  # Opus takes 8/12/16/24/48 kHz
    "aac": ("adts", "aac", "audio/aac", None),
    "flac": ("flac", "flac", "audio/flac", None),
}
CONTENT_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", **{k: v[2] for k, v in CODECS.items()}}
FORMATS = tuple(CONTENT_TYPES)


def wav_header(rate: int, data_bytes: int | None = None) -> bytes:
    """A RIFF/WAVE header for 16-bit mono; without a size, 0xFFFFFFFF: 'to the end of the stream'."""
    riff = 0xFFFFFFFF if data_bytes is None else data_bytes + 36
    data = 0xFFFFFFFF if data_bytes is None else data_bytes
    return (b"RIFF" + struct.pack("<I", riff) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


class _Sink:
    """Where PyAV's muxer writes; drained after every chunk."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def drain(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


class Encoder:
    """feed(pcm16 bytes) -> encoded bytes so far; finish() -> the rest."""

    def __init__(self, fmt: str, rate: int) -> None:
        self.fmt, self.rate, self._started = fmt, rate, False
        self._av: Any = None
        self._container: Any = None
        self._stream: Any = None
        if fmt in CODECS or fmt == "pcm":
            self._open(fmt)

    def _open(self, fmt: str) -> None:
        import av  # installed with faster-whisper (the services extra)

        self._av = av
        self._sink = _Sink()
        if fmt == "pcm":
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=PCM_RATE)
            return
        container, codec, _, rate = CODECS[fmt]
        self._container = av.open(self._sink, "w", format=container)
        self._stream = self._container.add_stream(codec, rate=rate or self.rate)
        self._stream.layout = "mono"
        fmt_name = self._stream.codec_context.format.name
        self._resampler = av.AudioResampler(format=fmt_name, layout="mono", rate=rate or self.rate)

    def feed(self, pcm: bytes) -> bytes:
        if self.fmt == "wav":
            head = b"" if self._started else wav_header(self.rate)
            self._started = True
            return head + pcm
        samples = np.frombuffer(pcm, dtype=np.int16).reshape(1, -1)
        frame = self._av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = self.rate
        return self._push(frame)

    def _push(self, frame: Any) -> bytes:
        out = []
        for resampled in self._resampler.resample(frame):
            if self._container is None:
                out.append(bytes(resampled.planes[0])[:resampled.samples * 2])
            else:
                for packet in self._stream.encode(resampled):
                    self._container.mux(packet)
        return b"".join(out) + self._sink.drain()

    def finish(self) -> bytes:
        if self.fmt == "wav":
            return b"" if self._started else wav_header(self.rate)
        tail = self._push(None)
        if self._container is not None:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
        return tail + self._sink.drain()
