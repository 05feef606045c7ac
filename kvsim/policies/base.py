"""The eviction-policy interface every policy implements.

A policy only *orders* the evictable blocks of one cache tier; the tier owns capacity, pinning and
counters (STYLE habit 2). Keys are block keys: ints naming a block's whole prefix (the engine's
dense block ids, `kvsim mrc`'s 64-bit block hashes). The tier calls:

- ``add(key, info)``    the block became evictable (released by its last user, or stored unpinned);
- ``access(key, info)`` the block was hit (it may be pinned or evictable at that moment);
- ``discard(key)``      the block stopped being evictable (pinned again by a hit, or evicted);
- ``forget(key)``       the block left the tier altogether (policies drop per-key history here,
                        or keep it as a ghost entry if the algorithm wants one);
- ``victim()``          which evictable block to evict next; choosing does not evict (habit 3).

``add`` is always followed, before the next ``add`` of the same key, by ``discard``.

Four batch hooks exist for the hot path (vLLM's block pool has the same: ``append_n`` /
``popleft_n``): ``add_many`` (a request's blocks released together, deepest first), ``pin_many``
(a request's prefix hit: each block accessed, the evictable ones discarded), ``discard_many``
(blocks a lower tier pins while they are loaded) and ``evict`` (choose and drop several
victims). Their defaults call the single-block hooks; a policy overrides
them only to go faster, never to behave differently, with one exception: a policy that evicts
whole groups of blocks (``sglang``: a radix node) may return more victims from ``evict`` than
asked, and the tier frees the extra ones.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from kvsim.errors import ConfigError

FutureFn = Callable[[int, float], float]  # (block key, now_s) -> when it is next used


@dataclass(frozen=True, slots=True)
class RequestHint:
    """What the serving system knows about the request whose blocks a tier is handed, in the
    spirit of the priority and agent hints engines accept (vLLM's ``priority``, SGLang's
    session params): never trace internals, never the future.

    ``session`` (-1: unknown) and ``turn`` (0-based) place the request in its conversation or
    agent run; ``parent`` is the request id of the call it follows (-1: none or unknown);
    ``category`` names its kind as the source labels it ('chat', 'api', 'agent', or the
    qwen-bailian types 'text', 'search', 'image', 'file'; '' unknown). ``tool_wait_s`` >= 0 says
    its reply is a tool call whose result should come back in about this long (0: the duration is
    unknown); -1: the reply is not a tool call, or nobody knows. The reply's content is known when
    the request finishes, which is when its blocks are released: no future is read.
    """

    session: int = -1
    turn: int = 0
    parent: int = -1
    category: str = ""
    tool_wait_s: float = -1.0


@dataclass(slots=True)
class BlockInfo:
    """What a policy may know about a block when it is added or accessed.

    ``now_s`` is simulated time (never wall-clock). ``position`` is the block's index in its
    request's prefix chain (0 = first block), ``parent`` the hash of the block before it (0 for the
    first), ``kind`` the segment kind of the block's last token (e.g. 'system', 'user', 'assistant',
    'tool', 'document'), ``size_bytes`` its bytes in this tier, ``recompute_s`` the estimated
    time to recompute it at its position (0: unknown, policies fall back to a position-based proxy).
    ``next_use`` is when the block is next accessed (same clock as ``now_s``, or an access index;
    ``inf`` = never), filled only for policies with ``needs_future``. ``request_tokens`` is the
    prompt length of the request that touched the block (0: unknown). ``hint`` is that
    request's `RequestHint` (None: the tier does not know the request, e.g. below HBM).
    ``lower_load_s`` is the time to load the block back from the tier it falls to when evicted
    here (``inf``: no tier below keeps it, so a later use recomputes it).
    """

    now_s: float = 0.0
    position: int = 0
    parent: int = 0
    kind: str = ""
    size_bytes: int = 1
    recompute_s: float = 0.0
    next_use: float = math.inf
    request_tokens: int = 0
    hint: RequestHint | None = None
    lower_load_s: float = math.inf
    # Set by the tier for the request whose blocks are being handed over; `at` derives the
    # per-block fields from them, so batch hooks need no per-block arguments.
    chain_kinds: Sequence[int] | None = None  # kind code of each block of the chain
    kind_names: Sequence[str] = ()  # code -> kind name
    recompute_base_s: float = 0.0  # recompute_s = base + per_position * position
    recompute_per_position_s: float = 0.0
    future: FutureFn | None = None  # (key, now_s) -> next use time

    def at(self, key: int, position: int, parent: int) -> BlockInfo:
        """Fill the per-block fields for `key` at `position` of the current chain."""
        self.position = position
        self.parent = parent
        if self.chain_kinds is not None and position < len(self.chain_kinds):
            self.kind = self.kind_names[self.chain_kinds[position]]
        self.recompute_s = self.recompute_base_s + self.recompute_per_position_s * position
        if self.future is not None:
            self.next_use = self.future(key, self.now_s)
        return self


def check_param(ok: bool, field: str, why: str) -> None:
    """Refuse a policy parameter out of its range (for ``Params.__post_init__``): one ConfigError
    line naming the parameter, to which the registry adds the policy's name."""
    if not ok:
        raise ConfigError(f"parameter {field!r} {why}")


class EvictionPolicy(ABC):
    """Orders the evictable blocks of one tier. Subclasses set ``name`` and implement the hooks."""

    name: ClassVar[str] = ""
    respects_prefix: ClassVar[bool] = False
    """True when victims are always leaves of the prefix tree by construction."""
    needs_future: ClassVar[bool] = False
    """True when the tier must fill ``BlockInfo.next_use`` (offline oracles)."""
    reads_info: ClassVar[bool] = False
    """True when a policy that overrides both ``add_many`` and ``pin_many`` still reads the
    request fields of ``BlockInfo`` (kinds, hint): the tier then fills them for it, as it does
    for every policy that keeps the base class's batch loops."""
    Params: ClassVar[type[Any] | None] = None
    """A dataclass of tunables with documented defaults; ``__init__`` then takes ``params``."""

    def set_capacity(self, blocks: int) -> None:  # noqa: B027 - optional hook
        """The tier holds ``blocks`` blocks; queue-partitioning policies size themselves here."""

    def miss(self, key: int, info: BlockInfo) -> None:  # noqa: B027 - optional hook
        """A lookup of ``key`` missed; it will be added after room is made for it."""

    @abstractmethod
    def add(self, key: int, info: BlockInfo) -> None: ...

    @abstractmethod
    def discard(self, key: int) -> None: ...

    @abstractmethod
    def victim(self) -> int:
        """The next block to evict; raises LookupError when nothing is evictable."""

    def add_many(
        self, keys: list[int], positions: list[int], parents: Sequence[int], info: BlockInfo
    ) -> None:
        """Several blocks became evictable, in this order; ``positions[i]`` and ``parents[i]``
        describe ``keys[i]`` (the shared ``info`` carries the rest, e.g. ``now_s``)."""
        for key, position, parent in zip(keys, positions, parents, strict=True):
            self.add(key, info.at(key, position, parent))

    def pin_many(self, keys: list[int], evictable: list[bool], info: BlockInfo) -> None:
        """A request hit ``keys`` (positions 0, 1, ... of its chain): each is accessed, and
        those with ``evictable[i]`` leave the evictable set (they are pinned now)."""
        for position, (key, was_evictable) in enumerate(zip(keys, evictable, strict=True)):
            self.access(key, info.at(key, position, keys[position - 1] if position else 0))
            if was_evictable:
                self.discard(key)

    def discard_many(self, keys: list[int]) -> None:
        """Each of ``keys`` stopped being evictable (a tier below HBM pinned them for a load),
        in this order."""
        for key in keys:
            self.discard(key)

    def evict(self, count: int) -> list[int]:
        """Choose and remove at least ``count`` victims, in order (each: victim, discard,
        forget); exactly ``count`` unless the policy evicts whole groups."""
        victims = []
        for _ in range(count):
            key = self.victim()
            self.discard(key)
            self.forget(key)
            victims.append(key)
        return victims

    def access(self, key: int, info: BlockInfo) -> None:  # noqa: B027 - optional hook
        """A hit on ``key``; recency- and frequency-based policies override this."""

    def head_groups(self) -> int:
        """KV-head groups per block that the engine's HBM tier should free one by one (1: whole
        blocks). A policy returning more must also be a ``GroupScorer``; the engine then builds
        a kvsim.kvcache.group_pool.GroupPool, which orders groups by the scorer's keys."""
        return 1

    def forget(self, key: int) -> None:  # noqa: B027 - optional hook
        """``key`` left the tier; drop any per-key history."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of evictable blocks currently ordered."""


class GroupScorer(Protocol):
    """What a head-granular tier asks of its policy: per-group scores, their ordering key, and
    the attention share each group holds for the request touching a block (to price a loss)."""

    tolerate_loss: float
    """A block missing groups whose attention share is at most this still hits (lossily)."""

    def touch(self, scores: list[float] | None, since_s: float, info: BlockInfo) -> list[float]:
        """The group scores after a touch at ``info.now_s`` (``scores`` set at ``since_s``)."""
        ...

    def key_of(self, score: float, now_s: float) -> float:
        """Static ordering key of one group's score set at ``now_s``: the lowest is evicted."""
        ...

    def group_attention(self, info: BlockInfo) -> list[float]:
        """Each group's attention on the block at ``info.position`` for the touching request."""
        ...
