"""HMAC secrets sealed at rest under the persister's master key (AES-256-GCM).

The master key comes from configuration (`OMS_PERSISTER_MASTER_KEY`, 32 bytes in
base64, or `OMS_PERSISTER_MASTER_KEY_FILE`), never from the database, so a copy of
the database (a backup, a replica, a dump) holds no secret that could sign for a
user. A sealed secret is

    version (1 byte, 1) | key id (8 bytes) | nonce (12 bytes) | ciphertext + tag

with the API key's id as associated data: a sealed secret copied onto another key's
row does not open. The key id (the first 8 bytes of SHA-256 over a label and the
key) says which master key sealed a row, so a wrong key is told apart from a
damaged row, and a rotation of the master key can find the rows still to reseal.
Ed25519 keys need none of this: the exchange holds only their public half.

A `MasterKey` seals with its own key only and opens what it or any of its retired
keys (`OMS_PERSISTER_RETIRED_MASTER_KEYS`) sealed; each persister reseals the rows of
retired keys under its own when it starts (`api_keys.reseal_retired_secrets`). A
rotation, with several persisters sharing the database, takes three rolls, so that
no persister ever meets a row it cannot open:
1. every persister is given the new key as a retired one (it opens, never seals);
2. the new key becomes `OMS_PERSISTER_MASTER_KEY` and the old one a retired one: each
   persister reseals the old rows as it starts, and one not rolled yet still opens
   what the others resealed;
3. once every start logs `persister.secrets_under_retired_keys rows=0`, the old key
   leaves the configuration.
A row sealed under a key the persister was not given stops its start, rather than
leaving users' keys that cannot open.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MASTER_KEY_BYTES = 32
VERSION = 1
KEY_ID_BYTES = 8
NONCE_BYTES = 12
HEADER_BYTES = 1 + KEY_ID_BYTES + NONCE_BYTES


class SealError(ValueError):
    """A sealed secret that does not open: another master key's, damaged, or moved."""


def _key_id(key: bytes) -> bytes:
    return hashlib.sha256(b"oms-persister-master-key\n" + key).digest()[:KEY_ID_BYTES]


def key_id_of(sealed: bytes) -> bytes:
    """The id of the master key that sealed `sealed` (empty if it is no sealed secret)."""
    return sealed[1 : 1 + KEY_ID_BYTES] if len(sealed) > HEADER_BYTES else b""


class MasterKey:
    def __init__(self, key: bytes, retired: Sequence[bytes] = ()) -> None:
        for candidate in (key, *retired):
            if len(candidate) != MASTER_KEY_BYTES:
                raise ValueError(f"a master key is {MASTER_KEY_BYTES} bytes, not {len(candidate)}")
        self._aead = AESGCM(key)
        self.key_id = _key_id(key)
        # Retired keys open what they sealed; they never seal again.
        self._openers = {_key_id(old): AESGCM(old) for old in retired}
        self._openers[self.key_id] = self._aead
        self.retired_key_ids = tuple(_key_id(old) for old in retired if _key_id(old) != self.key_id)

    @classmethod
    def from_text(cls, text: str, retired: Sequence[str] = ()) -> MasterKey:
        """From base64 (standard or URL-safe alphabet) of 32 bytes, and the retired keys."""
        return cls(_decoded(text), [_decoded(old) for old in retired])

    @classmethod
    def from_file(cls, path: Path, retired: Sequence[str] = ()) -> MasterKey:
        return cls.from_text(path.read_text(), retired)

    def opens(self, key_id: bytes) -> bool:
        """Whether this key, or one it retired, sealed under `key_id`."""
        return key_id in self._openers

    @staticmethod
    def new_text() -> str:
        """A fresh master key, as `from_text` reads it."""
        return base64.b64encode(os.urandom(MASTER_KEY_BYTES)).decode()

    def seal(self, api_key: str, secret: str) -> bytes:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, secret.encode(), api_key.encode())
        return bytes([VERSION]) + self.key_id + nonce + sealed

    def open(self, api_key: str, sealed: bytes) -> str:
        if len(sealed) <= HEADER_BYTES or sealed[0] != VERSION:
            raise SealError(f"{api_key}: not a sealed secret of version {VERSION}")
        key_id, nonce = sealed[1 : 1 + KEY_ID_BYTES], sealed[1 + KEY_ID_BYTES : HEADER_BYTES]
        opener = self._openers.get(key_id)
        if opener is None:
            raise SealError(f"{api_key}: sealed under another master key ({key_id.hex()})")
        try:
            return opener.decrypt(nonce, sealed[HEADER_BYTES:], api_key.encode()).decode()
        except InvalidTag as error:
            raise SealError(
                f"{api_key}: the sealed secret does not open (damaged or moved)"
            ) from error


def _decoded(text: str) -> bytes:
    try:
        return base64.b64decode(text.strip() + "==", altchars=b"-_", validate=False)
    except (binascii.Error, ValueError) as error:
        raise ValueError(f"a master key is not base64: {error}") from error
