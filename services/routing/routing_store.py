"""The routing document in etcd: one key per mesh (`/oms/v1/<mesh>/routing`), read,
replaced only by compare-and-swap, and watched.

A swap names the revision it read and carries the next epoch: two writers that read
the same document cannot both win, and epochs go up by exactly one per change, so a
reader that holds epoch N and sees N+2 knows it missed one. The value is the
document's canonical encoding (`core/routing_document.py`); a value that does not
decode is a `RoutingDocumentError`, never silently skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from services.coordination.errors import RevisionCompacted
from services.coordination.etcd_session import EtcdSession, prefix_end
from services.coordination.group_keys import mesh_prefix
from services.routing.core.routing_document import RoutingDocument, RoutingDocumentError

SWAP_ATTEMPTS = 5


class RoutingConflictError(RuntimeError):
    """Another writer changed the document since it was read: read again, decide again."""


@dataclass(frozen=True, slots=True)
class StoredRouting:
    document: RoutingDocument
    mod_revision: int  # the etcd revision that wrote it: what a swap compares

    @property
    def epoch(self) -> int:
        return self.document.epoch


def routing_key(mesh_id: str) -> bytes:
    return mesh_prefix(mesh_id) + b"routing"


class RoutingStore:
    def __init__(self, session: EtcdSession, mesh_id: str) -> None:
        self.session = session
        self.key = routing_key(mesh_id)

    async def read(self) -> StoredRouting | None:
        """The document as it is now; None before the mesh's first."""
        entry = await self.session.get(self.key)
        if entry is None:
            return None
        return StoredRouting(_decoded(entry.value, entry.mod_revision), entry.mod_revision)

    async def swap(
        self, expected: StoredRouting | None, document: RoutingDocument
    ) -> StoredRouting:
        """Replace `expected` (None: no document yet) by `document`, whose epoch must be
        the next one; RoutingConflictError if the key changed since `expected` was read."""
        next_epoch = 1 if expected is None else expected.epoch + 1
        if document.epoch != next_epoch:
            raise RoutingDocumentError(
                f"epoch {document.epoch}: the document after "
                f"{'none' if expected is None else f'epoch {expected.epoch}'} is epoch {next_epoch}"
            )
        written = await self.session.swap(
            self.key,
            document.encode(),
            mod_revision=0 if expected is None else expected.mod_revision,
        )
        if written is None:
            raise RoutingConflictError(
                f"the routing document changed since epoch "
                f"{'none' if expected is None else expected.epoch} was read"
            )
        return StoredRouting(document, written)

    async def change(
        self,
        decide: Callable[[StoredRouting | None], RoutingDocument],
        *,
        attempts: int = SWAP_ATTEMPTS,
    ) -> StoredRouting:
        """Read, decide the next document from what was read, swap; again on a conflict
        (decided afresh on what the other writer wrote), up to `attempts` times."""
        for _ in range(attempts):
            current = await self.read()
            try:
                return await self.swap(current, decide(current))
            except RoutingConflictError:
                continue
        raise RoutingConflictError(
            f"the routing document kept changing: gave up after {attempts} tries"
        )

    async def watch(self, after: StoredRouting | None) -> AsyncIterator[StoredRouting]:
        """Each document written after `after` (from the start if None), in order. When
        etcd's history before the next change is compacted away, the current document
        is read instead: a watcher may skip epochs, never go back."""
        revision = 0 if after is None else after.mod_revision
        while True:
            try:
                async for event in self.session.watch(
                    self.key, prefix_end(self.key), from_revision=revision + 1
                ):
                    if event.entry.key != self.key or event.kind != "put":
                        continue
                    revision = event.entry.mod_revision
                    yield StoredRouting(_decoded(event.entry.value, revision), revision)
                return
            except RevisionCompacted:
                current = await self.read()
                if current is not None and current.mod_revision > revision:
                    revision = current.mod_revision
                    yield current
                else:
                    revision = max(revision, self.session.revision)


def _decoded(raw: bytes, revision: int) -> RoutingDocument:
    try:
        return RoutingDocument.decode(raw)
    except RoutingDocumentError as error:
        raise RoutingDocumentError(
            f"the routing document at revision {revision}: {error}"
        ) from error
