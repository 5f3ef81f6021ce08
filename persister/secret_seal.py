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
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
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


class MasterKey:
    def __init__(self, key: bytes) -> None:
        if len(key) != MASTER_KEY_BYTES:
            raise ValueError(f"a master key is {MASTER_KEY_BYTES} bytes, not {len(key)}")
        self._aead = AESGCM(key)
        self.key_id = hashlib.sha256(b"oms-persister-master-key\n" + key).digest()[:KEY_ID_BYTES]

    @classmethod
    def from_text(cls, text: str) -> MasterKey:
        """From base64 (standard or URL-safe alphabet) of 32 bytes."""
        try:
            key = base64.b64decode(text.strip() + "==", altchars=b"-_", validate=False)
        except (binascii.Error, ValueError) as error:
            raise ValueError(f"the master key is not base64: {error}") from error
        return cls(key)

    @classmethod
    def from_file(cls, path: Path) -> MasterKey:
        return cls.from_text(path.read_text())

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
        if key_id != self.key_id:
            raise SealError(f"{api_key}: sealed under another master key ({key_id.hex()})")
        try:
            return self._aead.decrypt(nonce, sealed[HEADER_BYTES:], api_key.encode()).decode()
        except InvalidTag as error:
            raise SealError(
                f"{api_key}: the sealed secret does not open (damaged or moved)"
            ) from error
