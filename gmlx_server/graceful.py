"""uvicorn's server with a graceful stop on SIGTERM, so a rolling restart behind a load balancer loses nothing.

SIGTERM begins the host's drain (serving/drain.py): /health?ready=1 says `draining`, new POSTs get a typed
503, and the server keeps listening while the requests it admitted finish. Once none runs it exits; at the
deadline it sheds what still runs, and exits a few seconds later. SIGINT (Ctrl-C) and a second SIGTERM stop
at once, as uvicorn does (its 5 s grace, then the open streams are cut).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from types import FrameType

import uvicorn

from gmlx_server.serving.drain import shed_all
from gmlx_server.serving.model_host import ModelHost

log = logging.getLogger("gmlx.serve")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, host: ModelHost) -> None:
        super().__init__(config)
        self.host = host

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.host.drain.begin():
            log.info("SIGTERM: draining (not ready, new requests refused); stopping when the %d running "
                     "end, at most %g s", len(self.server_state.tasks), self.host.drain.deadline_s)
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        step = self.host.drain.step(busy=bool(self.server_state.tasks))  # a request's task ends with its stream
        if step == "shed":
            log.warning("drain deadline: shedding %d requests still running", shed_all(self.host.resident))
        elif step == "exit" and not self.should_exit:
            log.info("drained: stopping")
            self.should_exit = True
        return await super().on_tick(counter)


def serve_draining(config: uvicorn.Config, host: ModelHost) -> None:
    """What uvicorn.run does for one worker, with DrainingServer (Ctrl-C's KeyboardInterrupt is a normal stop)."""
    with contextlib.suppress(KeyboardInterrupt):
        DrainingServer(config, host).run()
