"""Peer identity: an Ed25519 key whose libp2p peer id is also the signer id of every record.

The peer id is the libp2p "identity" multihash of the protobuf-encoded public key:
`0x00 0x24` (identity hash, 36 bytes) + `0x08 0x01` (KeyType = Ed25519) + `0x12 0x20` (Data,
32 bytes) + the raw 32-byte key. Base58btc of those 38 bytes starts with `12D3KooW`. The key
can therefore be read back out of the id, so a record needs no separate public-key field, and
transport peer, gossip sender and record signer are one identity.
"""

from __future__ import annotations

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from protocol.errors import LocalProtocolError

PEER_ID_PREFIX = bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20])
PEER_ID_SIZE = len(PEER_ID_PREFIX) + 32
SIGNATURE_SIZE = 64


def peer_id_from_public_key(public_key: bytes) -> bytes:
    """The 38-byte libp2p peer id of a raw 32-byte Ed25519 public key."""
    if len(public_key) != 32:
        raise LocalProtocolError(f"Ed25519 public key must be 32 bytes, got {len(public_key)}")
    return PEER_ID_PREFIX + public_key


def is_peer_id(value: bytes) -> bool:
    """Whether `value` is a well-formed Ed25519 identity-multihash peer id."""
    return len(value) == PEER_ID_SIZE and value[: len(PEER_ID_PREFIX)] == PEER_ID_PREFIX


def public_key_from_peer_id(peer_id: bytes) -> bytes:
    """The raw Ed25519 public key inside a peer id."""
    if not is_peer_id(peer_id):
        raise LocalProtocolError("not an Ed25519 identity-multihash peer id")
    return peer_id[len(PEER_ID_PREFIX) :]


def peer_id_to_b58(peer_id: bytes) -> str:
    """Base58btc text form (`12D3KooW...`), as libp2p prints it."""
    return base58.b58encode(peer_id).decode("ascii")


def peer_text(peer: bytes | str) -> str:
    """A peer as people read it: the text form of a raw peer id, a text id as it is."""
    return peer_id_to_b58(peer) if isinstance(peer, bytes) else peer


def peer_id_from_b58(text: str) -> bytes:
    """Parse the text form; raises `LocalProtocolError` for anything but an Ed25519 peer id."""
    try:
        raw = base58.b58decode(text.strip())
    except ValueError as exc:
        raise LocalProtocolError(f"not a base58 peer id: {text!r}") from exc
    if not is_peer_id(raw):
        raise LocalProtocolError(f"not an Ed25519 peer id: {text!r}")
    return raw


def verify_signature(peer_id: bytes, message: bytes, signature: bytes) -> bool:
    """Whether `signature` is a valid Ed25519 signature of `message` by `peer_id`'s key."""
    if not is_peer_id(peer_id) or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(peer_id[len(PEER_ID_PREFIX) :]).verify(
            signature, message
        )
    except (InvalidSignature, ValueError):
        return False
    return True


class Identity:
    """A private Ed25519 key and the peer id derived from it."""

    __slots__ = ("_key", "peer_id")

    def __init__(self, key: Ed25519PrivateKey) -> None:
        self._key = key
        public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.peer_id: bytes = peer_id_from_public_key(public)

    @classmethod
    def generate(cls) -> Identity:
        """A new random Ed25519 identity."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, seed: bytes) -> Identity:
        """From the raw 32-byte private key (the Ed25519 seed)."""
        if len(seed) != 32:
            raise LocalProtocolError(f"Ed25519 private key must be 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    def private_bytes(self) -> bytes:
        """The raw 32-byte private key. Handle with care: whoever has it is this peer."""
        return self._key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        return self.peer_id[len(PEER_ID_PREFIX) :]

    @property
    def peer_id_b58(self) -> str:
        """The peer id as libp2p's base58 text."""
        return peer_id_to_b58(self.peer_id)

    def sign(self, message: bytes) -> bytes:
        """The Ed25519 signature of `message`."""
        return self._key.sign(message)

    def __repr__(self) -> str:
        return f"Identity({self.peer_id_b58})"
