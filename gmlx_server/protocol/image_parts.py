"""Image parts of the three protocols -> chat-template {"type": "image", "image": ImageRef} parts (pure).

OpenAI chat `image_url` ({"url": http(s) URL or data URI, "detail"}), Responses `input_image`
("image_url" a string, "detail"), Anthropic `image` blocks (source base64 or url). Only the shape is
checked here: the service fetches, decodes and sizes the image, and refuses it for a text-only model.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from gmlx_server.errors import InvalidRequest, UnsupportedFeature
from gmlx_server.generation_params import ImageRef
from gmlx_server.protocol import params as p

DETAILS = ("auto", "low", "high")


def image_part(ref: ImageRef) -> dict[str, Any]:
    return {"type": "image", "image": ref}


def parts_content(parts: Sequence[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text alone stays one string (lines joined, as before); with an image, the ordered parts list."""
    if any(part["type"] == "image" for part in parts):
        return list(parts)
    return "\n".join(part["text"] for part in parts)


def join_content(a: Any, b: Any) -> Any:
    """Two turns' contents as one: strings joined by a line, parts lists (a turn with images) concatenated."""
    if isinstance(a, list) or isinstance(b, list):
        return [*_as_parts(a), *_as_parts(b)]
    return "\n".join(c for c in (a, b) if c)


def _as_parts(content: Any) -> list[Any]:
    return list(content) if isinstance(content, list) else [{"type": "text", "text": content}] if content else []


def from_url(url: Any, where: str, part: str, detail: str | None = None) -> ImageRef:
    """An http(s) URL or a base64 data URI (the field `where` of the image part `part`), as OpenAI's image_url
    and input_image carry it."""
    if not isinstance(url, str) or not url:
        raise p.bad(where, f"expected an http(s) URL or a data: URI, got {p.json_type(url)}")
    if url.startswith("data:"):
        media, data = _data_uri(url, where)
        return ImageRef(part, data=data, media_type=media, detail=detail)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise InvalidRequest(f"'{where}': an image URL must be http(s):// or a base64 data: URI, got "
                             f"{scheme + ':' if scheme else 'no scheme'}", param=where, code="invalid_image_url")
    return ImageRef(part, url=url, detail=detail)


def _data_uri(uri: str, where: str) -> tuple[str, bytes]:
    head, sep, payload = uri[5:].partition(",")
    params = head.split(";")
    if not sep or "base64" not in params[1:]:
        raise InvalidRequest(f"'{where}': a data: URI image must be base64 (data:image/png;base64,...)",
                             param=where, code="invalid_image_url")
    return params[0].lower() or "", _b64(payload, where)


def _b64(payload: str, where: str) -> bytes:
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"'{where}': the image data is not valid base64", param=where,
                             code="invalid_image_data") from None


def _detail(part: Mapping[str, Any], where: str) -> str | None:
    detail = part.get("detail")
    if detail is not None and detail not in DETAILS:
        raise p.bad(f"{where}.detail", f"expected one of {', '.join(DETAILS)}, got {detail!r}")
    return detail


def openai_image(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    """{"type": "image_url", "image_url": {"url", "detail"}} (a bare string URL is accepted too)."""
    raw = part.get("image_url")
    if isinstance(raw, str):
        return image_part(from_url(raw, f"{where}.image_url", where))
    if not isinstance(raw, dict):
        raise p.bad(f"{where}.image_url", f'expected {{"url": ...}}, got {p.json_type(raw)}')
    detail = _detail(raw, f"{where}.image_url")
    return image_part(from_url(raw.get("url"), f"{where}.image_url.url", where, detail))


def responses_image(part: Mapping[str, Any], where: str) -> dict[str, Any]:
    """{"type": "input_image", "image_url": "...", "detail"}; file_id needs the Files API, which gmlx has not."""
    if part.get("file_id") is not None:
        raise UnsupportedFeature(f"'{where}.file_id': uploaded files are not supported; send image_url (an http(s) "
                                 "URL or a data: URI)", param=f"{where}.file_id")
    return image_part(from_url(part.get("image_url"), f"{where}.image_url", where, _detail(part, where)))


def anthropic_image(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """{"type": "image", "source": {"type": "base64", "media_type", "data"} | {"type": "url", "url"}}."""
    source = block.get("source")
    at = f"{where}.source"
    if not isinstance(source, dict):
        raise p.bad(at, f"expected an object, got {p.json_type(source)}")
    kind = source.get("type")
    if kind == "base64":
        media = p.required_string(source, "media_type", at)
        return image_part(ImageRef(where, data=_b64(p.required_string(source, "data", at), f"{at}.data"),
                                   media_type=media.lower()))
    if kind == "url":
        ref = from_url(p.required_string(source, "url", at), f"{at}.url", where)
        if ref.url is None:
            raise p.bad(f"{at}.url", "expected an http(s) URL (send data with a base64 source)")
        return image_part(ref)
    raise p.bad(f"{at}.type", f"expected base64 or url, got {kind!r}")
