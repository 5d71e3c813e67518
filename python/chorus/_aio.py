"""Tickets in asyncio: ``await run.log(...)``.

No chorus thread ever takes the GIL. A ticket's completion pushes a token
into a Notifier and writes its eventfd; the event loop watches the fd and
resolves the futures of the tokens it drains.
"""

import asyncio
import itertools
import weakref

from . import _chorus

_bridges = weakref.WeakKeyDictionary()


class _Bridge:
    def __init__(self, loop):
        self._notifier = _chorus.Notifier()
        self._futures = {}
        self._tokens = itertools.count()
        loop.add_reader(self._notifier.fileno(), self._drain)

    def future(self, ticket, loop):
        fut = loop.create_future()
        token = next(self._tokens)
        self._futures[token] = fut
        ticket._notify(self._notifier, token)
        return fut

    def _drain(self):
        for token in self._notifier.drain():
            fut = self._futures.pop(token, None)
            if fut is not None and not fut.done():
                fut.set_result(None)


def completion(ticket):
    """A future of the running loop that completes with `ticket`."""
    loop = asyncio.get_running_loop()
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _bridges[loop] = _Bridge(loop)
    return bridge.future(ticket, loop)
