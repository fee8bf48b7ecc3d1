"""Typed errors of the service routes (rendered by the one error mapper, like every GmlxError)."""

from __future__ import annotations

from gmlx_server.errors import GmlxError

EXTRA = "pip install 'gmlx[services]'"
WHAT = {"embeddings": "an embeddings model", "rerank": "a reranker", "stt": "a speech-to-text model",
        "tts": "a text-to-speech voice", "systemone": "a DiffusionGemma model"}


class ServiceNotConfigured(GmlxError):
    """The route's service has no entry under services: in the config."""

    status, type = 404, "service_not_configured"

    def __init__(self, route: str, kind: str, buildable: bool = True) -> None:
        how = (f"add services.{kind} to the config file" if buildable
               else f"services.{kind} would configure it, and this build cannot serve one yet")
        super().__init__(f"{route} needs {WHAT[kind]}: {how}", param="model",
                         extra={"config_key": f"services.{kind}"})


class ServiceExtraMissing(GmlxError):
    """The service is configured but its library is not installed."""

    status, type = 501, "service_extra_missing"

    def __init__(self, kind: str, module: str) -> None:
        super().__init__(f"the {kind} service needs the optional dependencies ({module} is not installed): "
                         f"{EXTRA}", extra={"extra": "services", "missing_module": module})


class ServiceUnavailable(GmlxError):
    """The service's model could not be fetched or loaded; the reason is also in /v1/models."""

    status, type = 503, "service_unavailable"

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"the {kind} service cannot serve: {reason}")
