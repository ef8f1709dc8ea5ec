"""The API's HTTP server: uvicorn's, draining the worker group while it still answers, and telling the routes
when it stops."""

from __future__ import annotations

import threading

import uvicorn


class ClosingServer(uvicorn.Server):
    """uvicorn's server that, asked to stop (SIGTERM, Ctrl-C), first runs `drain` (the running job finishes
    within --shutdown-grace) in a thread while the API goes on answering (/ready 503 saying so, a client
    polling its job sees it end), then sets `closing`, which ends the open event streams (uvicorn waits for
    every open connection, 5 s, then cancels them with an error in the log), and stops. The drain ran in the
    lifespan's shutdown, after uvicorn had closed its sockets: every request was refused for the whole grace.
    Asked again (a second Ctrl-C) it calls `hurry`: the drain's wait for the running job ends at once. It
    never calls uvicorn's `handle_exit`, whose signal, raised again once shut down, made a drained server
    exit 143 (SIGTERM) or 130 (Ctrl-C: a KeyboardInterrupt), skipping what follows `run`."""

    def __init__(self, closing: threading.Event, config: uvicorn.Config, hurry=lambda: None, drain=None):
        super().__init__(config)
        self.closing, self.hurry, self.drain = closing, hurry, drain
        self._draining = False

    def handle_exit(self, sig, frame) -> None:  # SIGTERM, SIGINT
        if self.should_exit or self._draining:  # not uvicorn's forced exit: it skipped the lifespan's
            self.hurry()  # shutdown, and the running job was left in progress, an attempt spent
            return
        if self.drain is None:
            self.stop()
            return
        self._draining = True
        threading.Thread(target=self._drain_then_stop, name="drain", daemon=True).start()

    def _drain_then_stop(self) -> None:
        try:
            self.drain()
        finally:
            self.stop()

    def stop(self) -> None:  # drained, or the worker group failed for good
        self.closing.set()
        self.should_exit = True
