"""A TCP proxy on loopback whose open connections can be frozen, as a half-dead link is.

`freeze()` stops relaying bytes on every connection open at that moment, in both
directions, while keeping the sockets open: a peer sees no error and no data, as
behind a NAT that dropped its mapping. Connections made afterwards are relayed as
usual. A gateway whose etcd watch runs through the proxy is thereby held on the
epoch it has, while a fresh read of etcd (a new connection) still gets through.

`partition()` also freezes every connection made from then on (accepted, never
relayed: a peer that reconnects gets no further), until `heal()`: the whole link is
cut, as by a network partition that drops packets.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

CHUNK = 65_536


@dataclass
class _Link:
    frozen: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


class FreezingProxy:
    def __init__(self, upstream: str, *, port: int = 0) -> None:
        self.port = port  # 0: any free port
        host, _, port_text = upstream.rpartition(":")
        self.upstream_host, self.upstream_port = host, int(port_text)
        self._server: asyncio.Server | None = None
        self._links: list[_Link] = []
        self.connections = 0
        self.partitioned = False

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start the proxy first"
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def freeze(self) -> int:
        """Freeze every connection open now; how many there were."""
        for link in self._links:
            link.frozen.set()
        return len(self._links)

    def partition(self) -> None:
        """Cut the link: freeze what is open, and every connection made until `heal`."""
        self.partitioned = True
        self.freeze()

    def heal(self) -> None:
        """New connections are relayed again (frozen ones stay frozen: their peers give
        up on them and reconnect)."""
        self.partitioned = False

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in self._links:
            for task in link.tasks:
                task.cancel()
            for writer in link.writers:
                writer.close()
        for link in self._links:
            await asyncio.gather(*link.tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writers=[writer])
        if self.partitioned:
            link.frozen.set()  # accepted, and held: nothing relayed either way
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
        except OSError:
            writer.close()
            return
        link.writers.append(up_writer)
        self._links.append(link)
        self.connections += 1
        link.tasks = [
            asyncio.create_task(self._pump(reader, up_writer, link)),
            asyncio.create_task(self._pump(up_reader, writer, link)),
        ]

    @staticmethod
    async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter, link: _Link) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while not link.frozen.is_set():
                reading = asyncio.ensure_future(source.read(CHUNK))
                freezing = asyncio.ensure_future(link.frozen.wait())
                await asyncio.wait({reading, freezing}, return_when=asyncio.FIRST_COMPLETED)
                freezing.cancel()
                if link.frozen.is_set():
                    reading.cancel()
                    break
                data = reading.result()
                if not data:
                    sink.close()
                    return
                sink.write(data)
                await sink.drain()
        # Frozen: hold the sockets open, relay nothing, until the proxy closes.
        await asyncio.Event().wait()
