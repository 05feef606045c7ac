"""The eviction-policy interface every policy implements.

A policy only *orders* the evictable blocks of one cache tier; the tier owns capacity, pinning and
counters (STYLE habit 2). Keys are 64-bit block hashes. The tier calls:

- ``add(key, info)``    the block became evictable (released by its last user, or stored unpinned);
- ``access(key, info)`` the block was hit (it may be pinned or evictable at that moment);
- ``discard(key)``      the block stopped being evictable (pinned again by a hit, or evicted);
- ``forget(key)``       the block left the tier altogether (policies drop per-key history here,
                        or keep it as a ghost entry if the algorithm wants one);
- ``victim()``          which evictable block to evict next; choosing does not evict (habit 3).

``add`` is always followed, before the next ``add`` of the same key, by ``discard``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar


@dataclass(slots=True)
class BlockInfo:
    """What a policy may know about a block when it is added or accessed.

    ``now_s`` is simulated time (never wall-clock). ``position`` is the block's index in its
    request's prefix chain (0 = first block), ``parent`` the hash of the block before it (0 for the
    first), ``kind`` the segment kind of the block's last token (e.g. 'system', 'user', 'assistant',
    'tool', 'document'), ``size_bytes`` its bytes in this tier, ``recompute_s`` the estimated time to
    recompute it at its position.
    """

    now_s: float = 0.0
    position: int = 0
    parent: int = 0
    kind: str = ""
    size_bytes: int = 1
    recompute_s: float = 0.0


class EvictionPolicy(ABC):
    """Orders the evictable blocks of one tier. Subclasses set ``name`` and implement the hooks."""

    name: ClassVar[str] = ""
    respects_prefix: ClassVar[bool] = False
    """True when victims are always leaves of the prefix tree by construction."""

    @abstractmethod
    def add(self, key: int, info: BlockInfo) -> None: ...

    @abstractmethod
    def discard(self, key: int) -> None: ...

    @abstractmethod
    def victim(self) -> int:
        """The next block to evict; raises LookupError when nothing is evictable."""

    def access(self, key: int, info: BlockInfo) -> None:  # noqa: B027 - optional hook
        """A hit on ``key``; recency- and frequency-based policies override this."""

    def forget(self, key: int) -> None:  # noqa: B027 - optional hook
        """``key`` left the tier; drop any per-key history."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of evictable blocks currently ordered."""
