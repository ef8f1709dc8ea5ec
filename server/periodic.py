"""A server's background chore: a daemon thread that calls `tick` every `every` seconds until stopped. A job
store that does not answer (`StoreBusy`) waits for the next tick; any other error is logged and the chore
goes on."""

from __future__ import annotations

import logging
import threading

from server.store import StoreBusy

log = logging.getLogger("ithaca.server")


class Periodic:
    name = "chore"
    every = 60.0

    def __init__(self):
        self._stop = threading.Event()

    def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> None:  # a thread each start: an app's lifespan may run again (a test's second client)
        self._stop = threading.Event()
        threading.Thread(target=self._loop, args=(self._stop,), name=self.name, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.every):
            try:
                self.tick()
            except StoreBusy:
                pass  # an outage: the next tick does it
            except Exception:
                log.exception("%s failed; trying again in %g s", self.name, self.every)
