"""create_app: the one place that wires routes, middleware, the error mapper and the lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import falcon
import falcon.asgi
import falcon.inspect

from gmlx_server.assistants import Assistants
from gmlx_server.auxiliary.service_host import ServiceHost
from gmlx_server.config import ServerConfig
from gmlx_server.errors import GmlxError
from gmlx_server.routes.auth import AuthMiddleware
from gmlx_server.routes.cache import CacheReset, CacheStats
from gmlx_server.routes.capacity import CapacityPlan, Estimate
from gmlx_server.routes.common import GmlxRequest, JsonBodyMiddleware
from gmlx_server.routes.drain import DrainGate
from gmlx_server.routes.error_mapper import handle_error
from gmlx_server.routes.generation import ChatCompletions, Completions
from gmlx_server.routes.guard import RequestGuard
from gmlx_server.routes.health import Health
from gmlx_server.routes.messages import CountTokens, Messages
from gmlx_server.routes.metrics import Metrics
from gmlx_server.routes.models import Model, Models
from gmlx_server.routes.openapi import OpenApi, Root
from gmlx_server.routes.request_log import RequestLogMiddleware
from gmlx_server.routes.residency import Keep, Reload, Unload
from gmlx_server.routes.responses import Responses
from gmlx_server.routes.services import Embeddings, Rerank, Speech, SystemOne, Transcriptions
from gmlx_server.routes.tokenization import ApplyTemplate, Detokenize, Tokenize
from gmlx_server.serving.cache_stats import resident_cache_stats
from gmlx_server.serving.conversations import ResponseStore
from gmlx_server.serving.estimate import Estimator
from gmlx_server.serving.ignored_fields import IgnoredFields
from gmlx_server.serving.model_host import EngineFactory, ModelHost
from gmlx_server.serving.prometheus import make_registry
from gmlx_server.serving.snapshot import Snapshotter
from gmlx_server.serving.tokenization import Tokenization
from gmlx_server.web_policy import HostPolicy, OriginPolicy

GmlxApp = falcon.asgi.App[GmlxRequest, falcon.asgi.Response]
log = logging.getLogger("gmlx.app")


# The operator routes: a client-scope key gets 403 insufficient_scope there, and each call is audited.
ADMIN_PATHS = ("/unload", "/v1/keep", "/v1/reload", "/v1/cache/reset")
GOVERNOR_PERIOD_S = 0.5
SUPERVISE_PERIOD_S = 0.25  # how soon a dead engine is noticed, its requests failed and its restart scheduled
SWEEP_PERIOD_S = 1.0  # the idle sweep's tick; a shorter idle_timeout_s ticks at a quarter of it


class Lifespan:
    """Runs the memory governor and the idle sweep while the app lives; closes every engine at shutdown."""

    def __init__(self, host: ModelHost, services: ServiceHost | None = None,
                 assistants: Assistants | None = None) -> None:
        self.host, self.services, self.assistants = host, services, assistants
        self._tasks: list[asyncio.Task[None]] = []

    async def process_startup(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        self._tasks = [asyncio.create_task(self._govern()), asyncio.create_task(self._sweep()),
                       asyncio.create_task(self._supervise())]
        if self.services is not None:
            self.services.start()  # hf: service models download in the background; load: start ones load
        if self.assistants is not None:
            await self.assistants.start()  # their MCP servers: a tool no server lists stops the start here

    async def _sweep(self) -> None:
        while True:
            timeout = self.host.config.server.idle_timeout_s  # read each tick: /v1/reload may change it
            await asyncio.sleep(min(SWEEP_PERIOD_S, max(0.05, timeout / 4)) if timeout > 0 else SWEEP_PERIOD_S)
            try:
                await self.host.sweep()
            except Exception:  # a failing unload must not stop the sweep
                log.exception("idle sweep failed")

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(SUPERVISE_PERIOD_S)
            try:
                await self.host.supervise()
            except Exception:  # a failing restart is logged by the host; the watch goes on
                log.exception("engine supervision failed")

    async def _govern(self) -> None:
        while True:
            try:
                self.host.governor.evaluate(self.host.resident)
            except Exception:  # a failing probe must not stop the governor
                log.exception("governor evaluation failed")
            await asyncio.sleep(GOVERNOR_PERIOD_S)

    async def process_shutdown(self, scope: dict[str, Any], event: dict[str, Any]) -> None:
        for task in self._tasks:
            task.cancel()
        if self.services is not None:
            self.services.close()
        if self.assistants is not None:
            await self.assistants.close()
        self.host.close()


def _metrics(host: ModelHost, config: ServerConfig, services: ServiceHost, assistants: Assistants) -> Metrics:
    snaps = Snapshotter(lambda: host.resident, host.telemetry, host.admission, host.governor,
                        config.server.decode_batch, host.capacity_section, lambda m: host.config.models.get(m),
                        host.marks, extra={"services": services.section, "assistants": assistants.section})
    return Metrics(snaps, make_registry(snaps.snapshot, host.telemetry, lambda: resident_cache_stats(host.resident)))


def _service_routes(services: ServiceHost) -> list[tuple[str, object]]:
    rerank, systemone = Rerank(services), SystemOne()
    return [("/v1/embeddings", Embeddings(services)), ("/v1/rerank", rerank), ("/rerank", rerank),
            ("/v1/audio/transcriptions", Transcriptions(services, "transcribe")),
            ("/v1/audio/translations", Transcriptions(services, "translate")),
            ("/v1/audio/speech", Speech(services)), ("/v1/systemone", systemone), ("/systemone", systemone)]


def _tokenizer_routes(tokenization: Tokenization) -> list[tuple[str, object]]:
    """llama-server's spellings at the root and vLLM's, each also under /v1."""
    resources = {"/tokenize": Tokenize(tokenization), "/detokenize": Detokenize(tokenization),
                 "/apply-template": ApplyTemplate(tokenization)}
    return [(prefix + path, resource) for path, resource in resources.items() for prefix in ("", "/v1")]


def _follow(services: ServiceHost, assistants: Assistants) -> Callable[[ServerConfig], None]:
    """What a reload that went through tells the services and the assistants."""
    def then(config: ServerConfig) -> None:
        services.reconfigure(config)
        assistants.commit(config)

    return then


def _routes(host: ModelHost, config: ServerConfig, services: ServiceHost,
            assistants: Assistants) -> list[tuple[str, object]]:
    models = Models(host, services.rows, assistants.rows)
    metrics = _metrics(host, config, services, assistants)
    estimator = Estimator(host)
    return [
        ("/v1/chat/completions", ChatCompletions(host, estimator, assistants)),
        ("/v1/completions", Completions(host)),
        ("/v1/messages", Messages(host, assistants)),
        ("/v1/messages/count_tokens", CountTokens(host)),
        ("/v1/responses", Responses(host, ResponseStore(), assistants)),  # previous_response_id lives per app
        ("/v1/models", models),
        ("/models", models),
        ("/v1/models/{model_id:path}", Model(host, services.rows, assistants.rows)),
        ("/health", Health(host, key_required=bool(config.server.keys))),
        ("/v1/estimate", Estimate(estimator)),
        ("/v1/capacity/plan", CapacityPlan(estimator, lambda: host.config.server)),
        ("/v1/metrics", metrics),
        ("/metrics", metrics),
        ("/unload", Unload(host, assistants)),  # the operator routes: ADMIN_PATHS
        ("/v1/keep", Keep(host)),
        ("/v1/reload", Reload(host, _follow(services, assistants), assistants.stage)),
        ("/v1/cache/stats", CacheStats(host)),
        ("/v1/cache/reset", CacheReset(host)),
        ("/openapi.json", OpenApi()),
        ("/", Root()),
        *_service_routes(services),
        *_tokenizer_routes(Tokenization(host, estimator)),
    ]


def create_app(
    config: ServerConfig,
    engine_factory: EngineFactory | None = None,
    *,
    check_headers: bool = True,
    host: ModelHost | None = None,
    services: ServiceHost | None = None,
    assistants: Assistants | None = None,
) -> GmlxApp:
    """The ASGI app. Engines are created lazily, on a model's first request, by `engine_factory`
    (default: gmlx_server.engine.factory.create_engine); `check_headers` off for engines whose entries name no
    real file (a test's fakes). Pass `host` (or `services`, `assistants`) to share or inspect it."""
    host = host if host is not None else ModelHost(config, engine_factory, check_headers=check_headers)
    services = services if services is not None else ServiceHost(config, host)
    assistants = assistants if assistants is not None else Assistants(config, host.telemetry)
    body = JsonBodyMiddleware(config.env.max_body_bytes, config.env.body_timeout_s)
    lifespan = Lifespan(host, services, assistants)
    middleware: list[Any] = [lifespan, DrainGate(host.drain), body]  # a draining host reads no body
    auth = AuthMiddleware(config.server.keys, ADMIN_PATHS, config.server.fair_share, host.telemetry)
    middleware.insert(0, auth)  # every request's caller; with keys, the key and its scope
    guard = RequestGuard(OriginPolicy(config.server.allowed_origins), HostPolicy(config.server.allowed_hosts))
    middleware.insert(0, guard)  # first: a preflight carries no key, a refused page gets no further
    # Before it: a refused generation request is logged too.
    middleware.insert(0, RequestLogMiddleware(IgnoredFields(host.telemetry)))
    app = falcon.asgi.App(middleware=middleware, request_type=GmlxRequest)
    for path, resource in _routes(host, config, services, assistants):
        app.add_route(path, resource)
    for exc in (Exception, falcon.HTTPError, GmlxError):
        app.add_error_handler(exc, handle_error)
    return app


def route_table(app: GmlxApp) -> list[tuple[str, str]]:
    """(method, path) for every responder the app serves, so tests can walk all routes."""
    out = []
    for route in falcon.inspect.inspect_routes(app):
        for method in route.methods:
            if not method.internal:
                out.append((method.method, route.path))
    return out
