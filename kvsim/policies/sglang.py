"""SGLang's RadixCache as it behaves: whole radix nodes, least recently used leaf first.

SGLang keeps the prefix cache as a radix tree whose nodes are runs of blocks (pages) inserted
together; a node splits where a later request's match or insert ends inside it, and nodes never
merge back (python/sglang/srt/mem_cache/radix_cache.py: ``_split_node``, ``_insert_helper``).
Eviction takes unlocked leaf nodes in order of last access and frees each *whole*, until at least
the shortfall is freed, so it may free more than asked (``evict``); a parent whose last child goes
becomes a candidate at its own last-access time. A match touches every node on the path, an
insert (at the end of a request) again; a split node's two halves are both touched.

Here the nodes are rebuilt from the tier's hooks: a request's prefix hit (``pin_many``) touches
its path and splits the node it ends in; the blocks a request releases (``add_many``) that the
policy has not seen form one new node under the block before them. ``evict`` may therefore return
more blocks than asked; the tier frees the extra ones. Only whole leaves go, so victims respect
the prefix tree; should no evictable leaf remain while evictable blocks do (a block whose child
is held by a running request the policy has not been told about), the least recently used
evictable block is taken rather than failing.

Differences from SGLang, at block granularity: a block a request recomputes although cached (its
hit was capped at input - 1 tokens) is not touched, as SGLang's insert touches it; a single
``add`` (outside a request's release, e.g. a lower tier) makes a one-block node.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from kvsim.policies.base import BlockInfo, EvictionPolicy


class _Node:
    """A run of blocks inserted together; ``evictable`` counts its blocks nobody holds."""

    __slots__ = ("alive", "children", "entry", "evictable", "keys", "parent", "stamp")

    def __init__(self, keys: list[int], parent: _Node | None, stamp: int) -> None:
        self.keys = keys
        self.parent = parent
        self.children = 0
        self.evictable = 0
        self.stamp = stamp
        self.entry: tuple[int, int, _Node] | None = None
        self.alive = True

    def __lt__(self, other: _Node) -> bool:  # heap ties are broken by sequence first
        return False


class SGLang(EvictionPolicy):
    name = "sglang"
    respects_prefix = True

    def __init__(self) -> None:
        self._node: dict[int, _Node] = {}  # known resident key -> its node
        self._evictable: set[int] = set()
        self._heap: list[tuple[int, int, _Node]] = []
        self._nodes = 0
        self._clock = 0
        self._seq = 0

    # -- tree -----------------------------------------------------------------------------------
    def _candidate(self, node: _Node) -> None:
        """Queue `node` if it is an evictable leaf (whole and unheld, no children)."""
        if node.children == 0 and node.evictable == len(node.keys) and node.keys:
            self._seq += 1
            node.entry = entry = (node.stamp, self._seq, node)
            heapq.heappush(self._heap, entry)
            if len(self._heap) > 2 * self._nodes + 1024:
                live = [n.entry for _, _, n in self._heap if n.alive and n.entry is not None]
                self._heap = list({id(e): e for e in live}.values())
                heapq.heapify(self._heap)

    def _touch(self, node: _Node, stamp: int) -> None:
        if node.stamp != stamp:
            node.stamp = stamp
            self._candidate(node)

    def _split_after(self, key: int, stamp: int) -> _Node:
        """Make `key` the last block of its node (SGLang's ``_split_node``); its node."""
        node = self._node[key]
        keys = node.keys
        if keys[-1] == key:
            return node
        cut = keys.index(key) + 1
        head = _Node(keys[:cut], node.parent, stamp)
        head.children = 1
        self._nodes += 1
        node.keys = keys[cut:]
        node.parent = head
        evictable = self._evictable
        moved = 0
        for k in head.keys:
            self._node[k] = head
            moved += k in evictable
        head.evictable = moved
        node.evictable -= moved
        node.stamp = stamp  # SGLang touches the node before splitting it: both halves
        self._candidate(node)
        return head

    def _new_node(self, keys: list[int], parent_key: int, stamp: int, evictable: bool) -> _Node:
        parent = self._split_after(parent_key, stamp) if parent_key in self._node else None
        node = _Node(keys, parent, stamp)
        self._nodes += 1
        if parent is not None:
            parent.children += 1
        for k in keys:
            self._node[k] = node
        if evictable:
            self._evictable.update(keys)
            node.evictable = len(keys)
            self._candidate(node)
        return node

    def _drop(self, node: _Node) -> None:
        node.alive = False
        node.entry = None
        self._nodes -= 1
        parent = node.parent
        if parent is not None and parent.alive:
            parent.children -= 1
            self._candidate(parent)

    # -- hooks ------------------------------------------------------------------------------------
    def add(self, key: int, info: BlockInfo) -> None:
        self._clock += 1
        node = self._node.get(key)
        if node is None:
            self._new_node([key], info.parent, self._clock, True)
            return
        if key not in self._evictable:
            self._evictable.add(key)
            node.evictable += 1
        node.stamp = self._clock
        self._candidate(node)

    def add_many(
        self, keys: list[int], positions: list[int], parents: Sequence[int], info: BlockInfo
    ) -> None:
        """One request's release (deepest first): touch its path, and the blocks not seen
        before become new nodes (one per run of consecutive ones), as SGLang's insert does."""
        self._clock += 1
        stamp = self._clock
        known = self._node
        evictable = self._evictable
        touched: list[_Node] = []
        run: list[int] = []
        run_parent = 0
        for i in range(len(keys) - 1, -1, -1):  # shallowest first
            key = keys[i]
            node = known.get(key)
            if node is None:
                parent = parents[i]
                if run and parent == run[-1]:
                    run.append(key)
                    continue
                if run:
                    self._new_node(run, run_parent, stamp, True)
                run, run_parent = [key], parent
                continue
            if run:
                self._new_node(run, run_parent, stamp, True)
                run = []
            if key not in evictable:
                evictable.add(key)
                node.evictable += 1
            if not touched or touched[-1] is not node:
                touched.append(node)
        if run:
            self._new_node(run, run_parent, stamp, True)
        for node in touched:
            node.stamp = stamp
            self._candidate(node)

    def access(self, key: int, info: BlockInfo) -> None:
        node = self._node.get(key)
        if node is not None:
            self._clock += 1
            self._touch(node, self._clock)

    def pin_many(self, keys: list[int], evictable: list[bool], info: BlockInfo) -> None:
        """A request's prefix hit (SGLang's match_prefix): touch every node on the path, split
        the one it ends in, and lock the blocks."""
        if not keys:
            return
        self._clock += 1
        stamp = self._clock
        known = self._node
        pool = self._evictable
        i = 0
        while i < len(keys):  # blocks cached by running requests the policy has not seen yet
            if keys[i] in known:
                i += 1
                continue
            end = i + 1
            while end < len(keys) and keys[end] not in known:
                end += 1
            self._new_node(keys[i:end], keys[i - 1] if i else 0, stamp, False)
            i = end
        self._split_after(keys[-1], stamp)
        for key, was_evictable in zip(keys, evictable, strict=True):
            node = known[key]
            if was_evictable and key in pool:
                pool.discard(key)
                node.evictable -= 1
            node.stamp = stamp

    def discard(self, key: int) -> None:
        if key in self._evictable:
            self._evictable.discard(key)
            self._node[key].evictable -= 1

    def forget(self, key: int) -> None:
        node = self._node.pop(key, None)
        if node is None:
            return
        if key in self._evictable:
            self._evictable.discard(key)
            node.evictable -= 1
        if node.keys[-1] == key:
            node.keys.pop()
        else:
            node.keys.remove(key)
        if not node.keys:
            self._drop(node)
        else:
            self._candidate(node)

    def _leaf(self) -> _Node | None:
        """The least recently used evictable leaf node, or None."""
        heap = self._heap
        while heap:
            _, _, node = entry = heap[0]
            if (
                node.alive
                and node.entry is entry
                and node.children == 0
                and node.evictable == len(node.keys)
            ):
                return node
            heapq.heappop(heap)
        return None

    def victim(self) -> int:
        node = self._leaf()
        if node is not None:
            return node.keys[-1]
        if not self._evictable:
            raise LookupError("no evictable block")
        return min(self._evictable, key=lambda k: (self._node[k].stamp, k))

    def evict(self, count: int) -> list[int]:
        """Whole leaf nodes, least recently used first, until at least `count` blocks are
        freed: may return more than `count` (SGLang's ``evict``)."""
        victims: list[int] = []
        known = self._node
        pool = self._evictable
        while len(victims) < count:
            node = self._leaf()
            if node is None:  # evictable blocks under held children: one at a time
                key = self.victim()
                self.discard(key)
                self.forget(key)
                victims.append(key)
                continue
            heapq.heappop(self._heap)
            keys = node.keys
            victims += keys
            for k in keys:
                del known[k]
            pool.difference_update(keys)
            node.keys = []
            node.evictable = 0
            self._drop(node)
        return victims

    def __len__(self) -> int:
        return len(self._evictable)
