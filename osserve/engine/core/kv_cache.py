"""KVCacheManager: paged block allocation with prefix caching, in plain Python (no tensors).

gpt-oss has two layer groups. Each has its own pool of blocks and its own block table per
request; all layers of a group share the group's tables (the model keeps one KV tensor per
layer, indexed by block id):

- "full": full attention; a request holds a block for every `block_size` tokens it has.
- "sliding": a query at position p sees keys p-W+1..p (W = sliding_window). Once a request's
  next query is at position q, blocks wholly before q-W+1 are never read again: they go back to
  the pool while the request runs and their table entries become -1 (a hole). Tables keep their
  length, so position p is always in entry p // block_size.

Prefix caching: a full block is named by a chained hash of its tokens (hash(previous block's
hash, tokens)); blocks are reference counted and, once free, stay findable by hash until the LRU
order hands them out again. A request admitted with a cached prefix of k blocks needs the full
group's blocks 0..k-1 and only the sliding group's blocks covering the window before position
k*block_size. Python's int/tuple hashes are deterministic within a process, which is all a
process-local cache needs.

A prompt's last block is findable too, by its tokens (a "tail"), once the prompt is computed: a
request with the same prompt takes the cached full blocks and a copy of that block, and computes
only its last token (whose logits it needs). The block is copied, not shared, because each
request writes its own tokens after the prompt into it; the copies wait in `take_copies` for the
runner, which makes them on the device before the step that needs them. Only whole blocks are
shared otherwise (vLLM's rule), so without this a repeated 63-token chat prompt recomputed 15
tokens per request (SGLang shares prefixes token by token).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from osserve.engine.core.request import Request

HOLE = -1


@dataclass
class KVCacheStats:
    prefix_cache_hits: int = 0  # tokens found in the cache at admission
    prefix_cache_queries: int = 0  # prompt tokens looked up


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    tail_hash: int | None = None  # findable as a prompt's last block (BlockPool.tails)


@dataclass(frozen=True, slots=True)
class BlockCopy:
    """A block's KV to copy, in every layer of `group`, before the next step runs."""

    group: str
    src: int
    dst: int


class BlockPool:
    """One group's blocks: ref counts, a free list in LRU order, and the hash index."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [_Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.tails: dict[int, int] = {}  # a prompt's last block: tail hash -> block id

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> int:
        block_id, _ = self.free.popitem(last=False)  # least recently freed first
        block = self.blocks[block_id]
        for index, name in ((self.cached, block.block_hash), (self.tails, block.tail_hash)):
            if name is not None and index.get(name) == block_id:
                del index[name]  # evict it from the prefix cache
        block.block_hash = block.tail_hash = None
        block.ref_count = 1
        return block_id

    def claim(self, block_id: int) -> None:
        """Take a reference on a cached block (a prefix-cache hit)."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free[block_id]
        block.ref_count += 1

    def release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[block_id] = None  # most recently used: evicted last

    def register(self, block_id: int, block_hash: int) -> None:
        if block_hash not in self.cached:
            self.blocks[block_id].block_hash = block_hash
            self.cached[block_hash] = block_id

    def register_tail(self, block_id: int, tail_hash: int) -> None:
        block = self.blocks[block_id]
        if tail_hash not in self.tails and block.tail_hash is None:
            block.tail_hash = tail_hash
            self.tails[tail_hash] = block_id


@dataclass(slots=True)
class _RequestBlocks:
    tables: dict[str, list[int]]
    hashes: list[int] = field(default_factory=list)  # chained hashes of its full blocks
    registered: int = 0  # blocks already offered to the prefix cache
    tail_registered: bool = False  # the prompt's last block, once the prompt is computed
    # Per sliding group: table entries before this index are HOLEs already, so each step's release
    # looks only at the blocks that left the window since the last one (not the whole table).
    released: dict[str, int] = field(default_factory=dict)
    # allocate_slots has nothing to do for a step that starts before `quiet_until` and ends by
    # `capacity`: no block to add in any group, none leaving a sliding window (15 decode steps in
    # 16 at block size 16), so it returns at once. Both are 0 until the first allocate_slots.
    capacity: int = 0  # positions below it have a table entry in every group
    quiet_until: float = 0  # the first num_computed_tokens at which a sliding block leaves the window


class KVCacheManager:
    def __init__(
        self, block_size: int, num_blocks: int | dict[str, int],
        groups: list[tuple[str, int | None]], enable_prefix_caching: bool = True,
    ) -> None:
        self.block_size = block_size
        self.windows = dict(groups)
        counts = num_blocks if isinstance(num_blocks, dict) else {g: num_blocks for g, _ in groups}
        self.pools = {g: BlockPool(counts[g]) for g, _ in groups}
        self.enable_prefix_caching = enable_prefix_caching
        self.stats = KVCacheStats()
        self.requests: dict[str, _RequestBlocks] = {}
        self.copies: dict[str, list[BlockCopy]] = {}  # by request: made before its first step

    @property
    def groups(self) -> list[str]:
        return list(self.pools)

    def num_blocks(self, group: str) -> int:
        return self.pools[group].num_blocks

    def num_free_blocks(self, group: str) -> int:
        return self.pools[group].num_free

    def usage(self) -> float:
        """Fraction of the largest-need pool in use (full attention when there is one)."""
        pool = self.pools.get("full") or next(iter(self.pools.values()))
        return 1.0 - pool.num_free / pool.num_blocks

    def block_tables(self, request_id: str) -> dict[str, list[int]]:
        return self.requests[request_id].tables

    def num_blocks_held(self, request_id: str, group: str) -> int:
        return sum(1 for b in self.requests[request_id].tables[group] if b != HOLE)

    # ------------------------------------------------------------------ sizing
    def blocks_needed(self, group: str, num_tokens: int, chunk: int) -> int:
        """Most blocks a request of num_tokens holds at once in `group` with steps of <= chunk."""
        window = self.windows[group]
        span = num_tokens if window is None else min(num_tokens, window - 1 + chunk)
        return math.ceil(span / self.block_size) + (0 if window is None else 1)

    def fits_at_all(self, num_tokens: int, chunk: int) -> bool:
        return all(self.blocks_needed(g, num_tokens, chunk) <= p.num_blocks for g, p in self.pools.items())

    # ------------------------------------------------------------------ prefix cache
    def _blocks_of(self, req: Request) -> _RequestBlocks:
        rb = self.requests.get(req.request_id)
        if rb is None:
            rb = self.requests[req.request_id] = _RequestBlocks({g: [] for g in self.pools})
        return rb

    def _hashes(self, req: Request, rb: _RequestBlocks, num_full_blocks: int) -> list[int]:
        bs = self.block_size
        while len(rb.hashes) < num_full_blocks:
            i = len(rb.hashes)
            parent = rb.hashes[-1] if rb.hashes else None
            rb.hashes.append(hash((parent, tuple(req.token_slice(i * bs, (i + 1) * bs)))))
        return rb.hashes[:num_full_blocks]

    def _window_blocks(self, group: str, k: int) -> range:
        """Block indices a request resuming at position k*block_size needs from `group`."""
        window = self.windows[group]
        first = 0 if window is None else max(0, k * self.block_size - window + 1) // self.block_size
        return range(first, k)

    def _cached_blocks(self, req: Request, rb: _RequestBlocks) -> tuple[int, list[int]]:
        """(k, hashes): the longest run of cached full blocks the request can take, leaving at least
        one token to compute, and its blocks' hashes."""
        max_blocks = (req.num_tokens - 1) // self.block_size
        hashes = self._hashes(req, rb, max_blocks)
        k = 0  # full-attention groups need the whole prefix: the longest run of cached blocks
        while k < max_blocks and all(
            hashes[k] in pool.cached for g, pool in self.pools.items() if self.windows[g] is None
        ):
            k += 1
        # Sliding groups need only the blocks of the window before position k * block_size.
        while k > 0 and not all(
            all(hashes[i] in pool.cached for i in self._window_blocks(g, k))
            for g, pool in self.pools.items() if self.windows[g] is not None
        ):
            k -= 1
        return k, hashes

    def _cached_tail(self, req: Request, rb: _RequestBlocks, k: int) -> dict[str, int] | None:
        """Per group, the cached block holding the request's tokens after its k full blocks, where
        they are its last block (and more than the one token it computes anyway)."""
        n = req.num_tokens
        if k != (n - 1) // self.block_size or n - k * self.block_size < 2:
            return None
        tail = self._tail_hash(req, rb, k, n)
        srcs: dict[str, int] = {}
        for g, pool in self.pools.items():
            if (src := pool.tails.get(tail)) is None:
                return None
            srcs[g] = src
        return srcs

    def cached_prefix_tokens(self, req: Request) -> int:
        """What claim_cached_prefix would return now, claiming nothing."""
        if not self.enable_prefix_caching:
            return 0
        rb = self._blocks_of(req)
        k, _ = self._cached_blocks(req, rb)
        return req.num_tokens - 1 if self._cached_tail(req, rb, k) is not None else k * self.block_size

    def claim_cached_prefix(self, req: Request) -> int:
        """At admission: take the longest cached prefix; returns its length in tokens (a multiple
        of block_size, or all tokens but the last where a copy of the last block was cached: at
        least one token is left to compute so the last one yields logits)."""
        rb = self._blocks_of(req)
        if not self.enable_prefix_caching:
            return 0
        k, hashes = self._cached_blocks(req, rb)
        for g, pool in self.pools.items():
            needed = self._window_blocks(g, k)
            table = [HOLE] * k
            for i in needed:
                table[i] = pool.cached[hashes[i]]
                pool.claim(table[i])
            rb.tables[g] = table
        rb.registered = k
        rb.released = {}
        rb.capacity = rb.quiet_until = 0  # new tables: the next allocate_slots takes the general path
        srcs = self._cached_tail(req, rb, k)
        hit = req.num_tokens - 1 if srcs is not None and self._copy_tail(req, rb, srcs) else k * self.block_size
        self.stats.prefix_cache_queries += req.num_tokens
        self.stats.prefix_cache_hits += hit
        return hit

    def _tail_hash(self, req: Request, rb: _RequestBlocks, k: int, end: int) -> int:
        """The name of a last block: its tokens k*block_size..end-1 after the k full blocks before it."""
        parent = self._hashes(req, rb, k)[-1] if k else None
        return hash(("tail", parent, tuple(req.token_slice(k * self.block_size, end))))

    def _copy_tail(self, req: Request, rb: _RequestBlocks, srcs: dict[str, int]) -> bool:
        """The request's last block from the tail cache: a fresh block in every group, to be filled
        by a copy of the cached one (`srcs`). All groups or none."""
        for g, src in srcs.items():  # held while the fresh blocks are taken, so none of them is a source
            self.pools[g].claim(src)
        ok = all(pool.num_free > 0 for pool in self.pools.values())
        if ok:
            copies = self.copies.setdefault(req.request_id, [])
            for g, src in srcs.items():
                dst = self.pools[g].allocate()
                rb.tables[g].append(dst)
                copies.append(BlockCopy(g, src, dst))
        for g, src in srcs.items():
            self.pools[g].release(src)
        return ok

    def take_copies(self) -> list[BlockCopy]:
        """The block copies the next step needs first (its newcomers' cached last blocks)."""
        out = [c for copies in self.copies.values() for c in copies]
        self.copies.clear()
        return out

    def cache_computed_blocks(self, req: Request) -> None:
        """Offer the request's fully computed blocks to the prefix cache, and its prompt's last block
        to the tail cache once the prompt is computed."""
        if not self.enable_prefix_caching:
            return
        rb = self.requests[req.request_id]
        n = req.num_prompt_tokens
        if not rb.tail_registered and req.num_computed_tokens >= n:
            rb.tail_registered = True
            k = (n - 1) // self.block_size  # the block holding the prompt's last token
            tail = self._tail_hash(req, rb, k, n)
            for g, pool in self.pools.items():
                if rb.tables[g][k] != HOLE:
                    pool.register_tail(rb.tables[g][k], tail)
        full = req.num_computed_tokens // self.block_size
        if full <= rb.registered:
            return
        hashes = self._hashes(req, rb, full)
        for g, pool in self.pools.items():
            table = rb.tables[g]
            for i in range(rb.registered, full):
                if table[i] != HOLE:
                    pool.register(table[i], hashes[i])
        rb.registered = full

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, req: Request, num_new_tokens: int) -> bool:
        """Give positions up to num_computed + num_new - 1 a slot in every group, freeing sliding
        blocks that the step's first query can no longer see. All or nothing."""
        rb = self._blocks_of(req)
        start = req.num_computed_tokens
        if start < rb.quiet_until and start + num_new_tokens <= rb.capacity:
            return True  # the general path below would change nothing
        bs = self.block_size
        end_blocks = math.ceil((start + num_new_tokens) / bs)
        for g, window in self.windows.items():
            if window is not None:
                first_needed = max(0, start - window + 1) // bs
                table = rb.tables[g]
                end = min(first_needed, len(table))
                for i in range(rb.released.get(g, 0), end):
                    if table[i] != HOLE:
                        self.pools[g].release(table[i])
                        table[i] = HOLE
                rb.released[g] = max(rb.released.get(g, 0), end)
        need = {g: max(0, end_blocks - len(rb.tables[g])) for g in self.pools}
        ok = not any(need[g] > self.pools[g].num_free for g in self.pools)
        if ok:
            for g, n in need.items():
                rb.tables[g].extend(self.pools[g].allocate() for _ in range(n))
        self._set_quiet(rb)
        return ok

    def _set_quiet(self, rb: _RequestBlocks) -> None:
        """The bounds of allocate_slots' early return: a step from position p needs no release while
        max(0, p - W + 1) // bs <= released, i.e. p < (released + 1) * bs + W - 1."""
        bs = self.block_size
        rb.capacity = bs * min(len(t) for t in rb.tables.values())
        rb.quiet_until = min(((rb.released.get(g, 0) + 1) * bs + w - 1 for g, w in self.windows.items()
                              if w is not None), default=math.inf)

    def can_allocate_all(self, reqs: list[Request], num_new_tokens: int | Sequence[int]) -> bool:
        """Whether allocate_slots(req, n) would succeed for every one of `reqs` in turn, n being
        num_new_tokens or, where that is a sequence, the request's own count (conservative: the
        sliding blocks it would release first are not counted as free)."""
        bs = self.block_size
        need = dict.fromkeys(self.pools, 0)
        counts = [num_new_tokens] * len(reqs) if isinstance(num_new_tokens, int) else num_new_tokens
        for req, n in zip(reqs, counts, strict=True):
            rb = self.requests.get(req.request_id)
            end = req.num_computed_tokens + n
            if rb is not None and end <= rb.capacity:
                continue  # every group's table reaches `end` already (allocate_slots' bounds)
            end_blocks = math.ceil(end / bs)
            for g in self.pools:
                need[g] += max(0, end_blocks - (len(rb.tables[g]) if rb else 0))
        return all(need[g] <= pool.num_free for g, pool in self.pools.items())

    def free(self, request_id: str) -> None:
        """Release every block the request holds (tail first, so prefixes stay cached longer)."""
        self.copies.pop(request_id, None)
        rb = self.requests.pop(request_id, None)
        if rb is None:
            return
        for g, table in rb.tables.items():
            for block_id in reversed(table):
                if block_id != HOLE:
                    self.pools[g].release(block_id)


def sliding_window_savings(block_size: int, window: int, context: int, chunk: int = 1) -> tuple[int, int]:
    """(blocks a sliding layer holds, blocks a full layer holds) for one request at `context`."""
    full = math.ceil(context / block_size)
    first_needed = max(0, context - chunk - window + 1) // block_size
    return full - first_needed, full
