"""One service: its worker thread, its model (loaded on that thread), its concurrency cap and its counters."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gmlx_plan.queueing import retry_after_s
from gmlx_server.auxiliary.fetch import ModelSource
from gmlx_server.auxiliary.service_errors import ServiceExtraMissing, ServiceUnavailable
from gmlx_server.auxiliary.stats import ServiceStats
from gmlx_server.config import ServiceEntry
from gmlx_server.errors import GmlxError, ServerOverloaded
from gmlx_server.serving.load_gate import HeldWeights

T = TypeVar("T")


class ServiceBackend(Protocol):
    """What the service layer reads of every loaded backend (each kind's job knows the rest of its own)."""

    @property
    def backend(self) -> str: ...


Loader = Callable[[ServiceEntry, Path | None], ServiceBackend]  # builds the backend on the worker thread
FALLBACK_S = 2.0  # a request's seconds before any has finished, for Retry-After
log = logging.getLogger("gmlx.services")


def path_bytes(path: Path | None) -> int:
    """A model's size on disk: what loading it adds, roughly."""
    if path is None or not path.exists():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class _Stopped(Exception):
    """Raised inside a streaming job when its reader has gone."""


class Lease:
    """One admitted request: counted in flight until finish()."""

    def __init__(self, service: Service, bytes_in: int) -> None:
        self.service, self.started, self.done = service, service.clock(), False
        service.in_flight += 1
        service.stats.bytes_in += bytes_in

    def finish(self, ok: bool, bytes_out: int = 0) -> None:
        if self.done:
            return
        self.done = True
        self.service.in_flight -= 1
        self.service.stats.bytes_out += bytes_out
        self.service.stats.finished(self.service.clock() - self.started, ok)


class Service:
    """state: unloaded, downloading, loading, ready or failed (`error` says why)."""

    def __init__(self, entry: ServiceEntry, source: ModelSource | None, loader: Loader, held: HeldWeights,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`held`: where its loaded weights are counted for the chat models' load gate."""
        self.entry, self.source, self.loader, self.held, self.clock = entry, source, loader, held, clock
        self.backend: Any = None  # the kind's backend, which its job calls
        self.backend_name: str | None = None  # which library serves it, once loaded
        self.load_error: str | None = None
        self.loading = False
        self.load_s: float | None = None
        self.weights_bytes = 0
        self.in_flight = 0
        self.stats = ServiceStats()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"gmlx-service-{entry.kind}")

    @property
    def kind(self) -> str:
        return self.entry.kind

    @property
    def held_name(self) -> str:
        """Its name among the weights the load gate counts (and its refusals show)."""
        return f"service {self.kind}"

    @property
    def state(self) -> str:
        if self.source is not None and self.source.state in ("downloading", "failed") and self.backend is None:
            return self.source.state
        if self.backend is not None:
            return "ready"
        return "loading" if self.loading else ("failed" if self.load_error else "unloaded")

    @property
    def error(self) -> str | None:
        return self.source.error if self.source is not None and self.source.error else self.load_error

    # --- admission ---------------------------------------------------------------------------------

    def admit(self, bytes_in: int = 0) -> Lease:
        """A lease, or a typed 503: while the model downloads, after its download failed, or at the cap."""
        if self.source is not None and self.backend is None:
            self.source.local_path()
        cap = self.entry.max_concurrent
        if self.in_flight >= cap:
            self.stats.outcomes["rejected"] += 1
            retry = retry_after_s((self.stats.mean_s or FALLBACK_S) * self.in_flight)
            raise ServerOverloaded(f"server overloaded: the {self.kind} service has {self.in_flight} requests in "
                                   f"flight (services.{self.kind}.max_concurrent {cap}); retry after {retry} s",
                                   retry)
        return Lease(self, bytes_in)

    @asynccontextmanager
    async def admitted(self, bytes_in: int = 0) -> AsyncIterator[Lease]:
        lease, ok = self.admit(bytes_in), False
        try:
            yield lease
            ok = True
        finally:
            lease.finish(ok)

    # --- the worker thread -------------------------------------------------------------------------

    async def call(self, job: Callable[[Any], T]) -> T:
        """job(backend) on the worker thread, after loading the model there if it is not loaded yet."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: job(self._loaded()))

    async def stream(self, job: Callable[[Any, Callable[[bytes], None]], None]) -> AsyncIterator[bytes]:
        """job(backend, emit) on the worker thread; what it emits is yielded here as it comes. Closing the
        iterator early (the client left) stops the job at its next emit."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        stop = threading.Event()

        def emit(data: bytes) -> None:
            if stop.is_set():
                raise _Stopped
            if data:
                loop.call_soon_threadsafe(queue.put_nowait, data)

        def run() -> None:
            with contextlib.suppress(_Stopped):
                job(self._loaded(), emit)

        def done(fut: asyncio.Future[None]) -> None:
            queue.put_nowait(None if fut.cancelled() else fut.exception())

        loop.run_in_executor(self._pool, run).add_done_callback(done)
        try:
            while (item := await queue.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    def start_load(self) -> None:
        """load: start: queue the load on the worker once the files are there (after a download)."""
        def queue() -> None:
            self._pool.submit(self._quiet_load)

        if self.source is None:
            queue()
        else:
            self.source.start(queue)

    def _quiet_load(self) -> None:
        with contextlib.suppress(GmlxError):  # logged and kept in load_error; /v1/models shows it
            self._loaded()

    def _loaded(self) -> Any:
        if self.backend is not None:
            return self.backend
        path = self.source.local_path() if self.source is not None else None
        self.loading, t0 = True, self.clock()
        try:
            loaded = self.loader(self.entry, path)
            self.backend, self.backend_name = loaded, loaded.backend
        except ImportError as exc:
            module = (exc.name or str(exc)).split(".")[0]  # the package to install, not its submodule
            self.load_error = f"{module} is not installed"
            raise ServiceExtraMissing(self.kind, module) from None
        except GmlxError as exc:
            self.load_error = exc.message
            raise
        except Exception as exc:
            self.load_error = f"{type(exc).__name__}: {exc}"
            log.error("service %s: loading %s failed: %s", self.kind, path, self.load_error)
            raise ServiceUnavailable(self.kind, f"loading {path} failed: {self.load_error}") from exc
        finally:
            self.loading = False
        self.load_error, self.load_s, self.weights_bytes = None, self.clock() - t0, path_bytes(path)
        if self.weights_bytes:
            self.held.hold(self.held_name, self.weights_bytes)
        log.info("service %s: loaded %s in %.2f s", self.kind, path, self.load_s)
        return self.backend

    def close(self) -> None:
        self.backend = self.backend_name = None  # no backend holds more than memory: dropping it frees it
        self.held.release(self.held_name)
        self._pool.shutdown(wait=False, cancel_futures=False)

    def section(self) -> dict[str, Any]:
        """This service's part of /v1/metrics' services section."""
        return {"id": self.entry.id, "kind": self.kind, "state": self.state, "error": self.error,
                "in_flight": self.in_flight, "max_concurrent": self.entry.max_concurrent,
                "weights_bytes": self.weights_bytes or None,
                "load_s": round(self.load_s, 3) if self.load_s is not None else None, **self.stats.section()}
