"""KVCacheManager without any model: counts of blocks held, freed, cached and evicted."""

from __future__ import annotations

import numpy as np

from osserve.engine.core.kv_cache import HOLE, KVCacheManager, sliding_window_savings
from osserve.engine.core.request import Request
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.worker.cuda_graphs import block_table_array

BS = 16
GROUPS = [("sliding", 128), ("full", None)]


def req(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(), 0.0)


def compute(kv: KVCacheManager, r: Request, chunk: int) -> None:
    """Drive a request through its prompt in chunks, as the scheduler would."""
    while r.num_computed_tokens < r.num_tokens:
        n = min(chunk, r.num_tokens - r.num_computed_tokens)
        assert kv.allocate_slots(r, n)
        r.num_computed_tokens += n
        kv.cache_computed_blocks(r)


def test_sliding_group_frees_blocks_outside_the_window() -> None:
    kv = KVCacheManager(BS, 1000, GROUPS)
    r = req("a", list(range(2000)))
    compute(kv, r, 256)
    full = kv.num_blocks_held("a", "full")
    sliding = kv.num_blocks_held("a", "sliding")
    assert full == 125  # ceil(2000 / 16)
    # The last chunk [1792, 2000) needed keys from 1792 - 127 = 1665 on: blocks 104..124.
    assert sliding == 125 - 1665 // BS == 21
    table = kv.block_tables("a")["sliding"]
    assert len(table) == 125 and table[:104] == [HOLE] * 104 and HOLE not in table[104:]
    kv.free("a")
    assert kv.num_free_blocks("full") == kv.num_free_blocks("sliding") == 1000


def test_decode_keeps_only_the_window() -> None:
    kv = KVCacheManager(BS, 1000, GROUPS)
    r = req("a", list(range(1000)))
    compute(kv, r, 1)
    assert kv.num_blocks_held("a", "sliding") <= 128 // BS + 1
    assert kv.num_blocks_held("a", "full") == 63


def test_savings_at_8k_and_32k() -> None:
    for ctx in (8192, 32768):
        sliding, full = sliding_window_savings(BS, 128, ctx)
        assert full == ctx // BS and sliding <= 9


def test_allocation_is_all_or_nothing() -> None:
    kv = KVCacheManager(BS, {"sliding": 100, "full": 4}, GROUPS)
    r = req("a", list(range(100)))
    assert not kv.allocate_slots(r, 100)  # 7 full blocks needed, 4 exist
    assert kv.num_free_blocks("sliding") == 100 and kv.num_free_blocks("full") == 4
    assert kv.allocate_slots(r, 64)
    assert kv.num_free_blocks("full") == 0


def test_prefix_cache_hit_ref_counts_and_lru() -> None:
    kv = KVCacheManager(BS, 64, GROUPS)
    prefix = list(range(300))
    a = req("a", prefix + [1, 2])
    compute(kv, a, 64)
    b = req("b", prefix + [7, 8, 9])
    hit = kv.claim_cached_prefix(b)
    assert hit == 288 and kv.stats.prefix_cache_hits == 288
    assert kv.stats.prefix_cache_queries == b.num_tokens
    shared = kv.block_tables("b")["full"][:18]
    assert shared == kv.block_tables("a")["full"][:18]
    assert all(kv.pools["full"].blocks[i].ref_count == 2 for i in shared)
    # The sliding group shares only the window before position 288: blocks 10..17.
    assert kv.block_tables("b")["sliding"][:10] == [HOLE] * 10
    kv.free("a")
    kv.free("b")
    assert kv.num_free_blocks("full") == 64
    # Freed blocks stay cached until reused: a third request still hits.
    c = req("c", prefix + [5])
    assert kv.claim_cached_prefix(c) == 288
    kv.free("c")
    # Filling the pool with other data evicts the least recently freed blocks first.
    d = req("d", list(range(1000, 1000 + 64 * BS)))
    assert kv.allocate_slots(d, 64 * BS)
    kv.free("d")
    e = req("e", prefix + [5])
    assert kv.claim_cached_prefix(e) == 0


def test_whole_prompt_is_never_a_hit() -> None:
    kv = KVCacheManager(BS, 64, GROUPS)
    a = req("a", list(range(64)))
    compute(kv, a, 64)
    kv.free("a")
    kv.pools["full"].tails.clear()  # only the full blocks: the prompt's last block is not cached
    b = req("b", list(range(64)))
    assert kv.claim_cached_prefix(b) == 48  # the last token must be computed for its logits
    assert kv.take_copies() == []


def test_a_repeated_prompt_copies_its_cached_last_block() -> None:
    kv = KVCacheManager(BS, 64, GROUPS)
    prompt = list(range(63))  # 3 full blocks and 15 tokens
    a = req("a", prompt)
    compute(kv, a, 64)
    a_tables = {g: list(t) for g, t in kv.block_tables("a").items()}
    b = req("b", prompt)
    assert kv.claim_cached_prefix(b) == 62  # all but the last token, which is computed for its logits
    assert kv.stats.prefix_cache_hits == 62
    copies = kv.take_copies()
    assert kv.take_copies() == []  # taken once
    b_tables = kv.block_tables("b")
    # Per group: block 3 is a fresh block, to be filled from a's block 3 before b's first step.
    assert sorted((c.group, c.src, c.dst) for c in copies) == sorted(
        (g, a_tables[g][3], b_tables[g][3]) for g in kv.groups)
    assert all(b_tables[g][3] != a_tables[g][3] for g in kv.groups)
    assert b_tables["full"][:3] == a_tables["full"][:3]  # the full blocks are shared
    assert kv.allocate_slots(b, 1)  # the last token's slot is in the copied block: nothing to add
    assert len(b_tables["full"]) == 4
    # A different last token, or a prompt that goes on, finds no such block.
    assert kv.claim_cached_prefix(req("c", prompt[:-1] + [999])) == 48
    assert kv.claim_cached_prefix(req("d", prompt + [5, 6])) == 48
    kv.free("c")
    kv.free("d")
    assert kv.take_copies() == []  # freed before their step: their copies went with them
    # Reused for other data, a block is no longer found as anyone's last block.
    kv.free("a")
    kv.free("b")
    e = req("e", list(range(1000, 1000 + 64 * BS)))
    assert kv.allocate_slots(e, 64 * BS)
    kv.free("e")
    assert kv.claim_cached_prefix(req("f", prompt)) == 0 and kv.take_copies() == []


def test_the_cached_last_block_is_all_groups_or_none() -> None:
    kv = KVCacheManager(BS, {"sliding": 64, "full": 5}, GROUPS)
    prompt = list(range(40))  # 2 full blocks and 8 tokens
    compute(kv, req("a", prompt), 64)
    assert kv.num_free_blocks("full") == 2
    assert kv.claim_cached_prefix(req("b", prompt)) == 39
    assert kv.num_free_blocks("full") == 1
    c = req("c", prompt)
    kv.allocate_slots(req("x", list(range(16))), 16)  # takes the last free full block
    assert kv.claim_cached_prefix(c) == 32  # no full block to copy into: the full blocks only
    assert all(len(t) == 2 for t in kv.block_tables("c").values())  # no sliding block taken either
    assert sorted(copy.group for copy in kv.take_copies()) == ["full", "sliding"]  # b's, none of c's


def test_fits_at_all() -> None:
    kv = KVCacheManager(BS, {"sliding": 20, "full": 10}, GROUPS)
    assert kv.fits_at_all(160, chunk=16) and not kv.fits_at_all(161, chunk=16)


def test_block_table_array_left_aligned_with_padding_rows() -> None:
    """The runner's [rows, longest table] array: tables left-aligned, holes and padding kept -1."""
    rows = block_table_array([[1, 2, 3], [4], [], [HOLE, HOLE, 7, 8]], 6)
    assert rows.dtype == np.int32 and rows.shape == (6, 4)
    assert rows.tolist() == [[1, 2, 3, -1], [4, -1, -1, -1], [-1] * 4, [-1, -1, 7, 8], [-1] * 4, [-1] * 4]
