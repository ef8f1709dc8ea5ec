"""The API's HTTP server: uvicorn's, telling the routes when it is asked to stop."""

from __future__ import annotations

import contextlib
import threading

import uvicorn


class ClosingServer(uvicorn.Server):
    """uvicorn's server that, once asked to stop, sets `closing`, which ends the open event streams: uvicorn
    waits for every open connection (5 s, then cancels them with an error in the log) before it stops. Asked
    again (a second Ctrl-C) it calls `hurry`: the shutdown's wait for the running job (the lifespan's, which
    holds the event loop, so uvicorn's own second-signal exit never came) ends at once."""

    def __init__(self, closing: threading.Event, config: uvicorn.Config, hurry=lambda: None):
        super().__init__(config)
        self.closing, self.hurry = closing, hurry

    def handle_exit(self, sig, frame) -> None:  # SIGTERM, SIGINT
        if self.should_exit:  # not uvicorn's forced exit: it skipped the lifespan's shutdown, and the
            self.hurry()  # running job was left in progress, an attempt spent
            return
        self.closing.set()
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn's, less its raising of the signal again once shut down: that killed the drained server
        (SIGTERM: exit 143, skipping what follows `run`; Ctrl-C: a KeyboardInterrupt, exit 130), where a
        drain asked for and done is a clean exit, 0."""
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()

    def stop(self) -> None:  # the worker group failed for good
        self.closing.set()
        self.should_exit = True
