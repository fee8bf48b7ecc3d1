"""The prompt cache store: tiers, longest prefix, and the byte bound under random request sequences."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gmlx_server.engine.prompt_cache import PIN_SHARE, Entry, PromptCache


def _entry(tokens: list[int], nbytes: int = 100, trimmable: bool = True, **kw: object) -> Entry:
    return Entry(tuple(tokens), (), nbytes, trimmable, **kw)  # type: ignore[arg-type]


def test_exact_prompt_reuses_all_but_the_last_token() -> None:
    pc = PromptCache(10_000, block=4)
    pc.store(_entry(list(range(10))))
    peeked = pc.peek(list(range(10)))
    assert peeked is not None and peeked.tier == "exact" and pc.stats()["hits"]["exact"] == 0  # peek counts nothing
    hit = pc.lookup(list(range(10)))
    assert hit is not None and hit.tier == "exact" and hit.tokens == 9


def test_block_tier_reuses_the_shared_prefix_of_a_trimmable_entry() -> None:
    pc = PromptCache(10_000, block=4)
    pc.store(_entry(list(range(20))))
    hit = pc.lookup([*range(10), 99, 98, 97])
    assert hit is not None and hit.tier == "block" and hit.tokens == 10  # two blocks, then token by token
    assert pc.lookup([5, 6, 7]) is None and pc.misses == 1


def test_window_entries_are_reused_only_at_their_exact_length() -> None:
    pc = PromptCache(10_000, block=4)
    pc.store(_entry(list(range(20)), trimmable=False))
    assert pc.lookup([*range(10), 99, 98]) is None  # cannot be cut back to 10
    hit = pc.lookup([*range(20), 7, 8])
    assert hit is not None and hit.tier == "ckpt" and hit.tokens == 20


def test_one_short_window_snapshot_with_its_tail_is_the_exact_tier() -> None:
    pc = PromptCache(10_000, block=4)
    pc.store(_entry(list(range(9)), trimmable=False, tail=9))
    hit = pc.lookup(list(range(10)))
    assert hit is not None and hit.tier == "exact" and hit.tokens == 9
    other = pc.lookup([*range(9), 55])
    assert other is not None and other.tier == "ckpt"


def test_checkpoint_and_anchor_tiers_and_the_longest_wins() -> None:
    pc = PromptCache(10_000, block=4)
    pc.store(_entry(list(range(5)), trimmable=False, pinned=True, kind="ckpt"))
    pc.store(_entry(list(range(12)), trimmable=False, kind="ckpt"))
    hit = pc.lookup(list(range(30)))
    assert hit is not None and hit.tier == "ckpt" and hit.tokens == 12
    hit = pc.lookup([*range(8), 77, 78])
    assert hit is not None and hit.tier == "anchor" and hit.tokens == 5
    assert pc.stats()["hits"] == {"exact": 0, "block": 0, "ckpt": 1, "anchor": 1, "disk": 0}
    assert pc.stats()["tokens_reused"] == 17


def test_lru_eviction_spares_pinned_and_recently_used() -> None:
    pc = PromptCache(300, block=4)
    pc.store(_entry([1, 1, 1], pinned=True))
    pc.store(_entry([2, 2, 2]))
    pc.store(_entry([3, 3, 3]))
    assert pc.lookup([2, 2, 2, 0]) is not None  # 2 is now more recent than 3
    pc.store(_entry([4, 4, 4]))
    assert pc.evictions == 1 and pc.lookup([3, 3, 3, 0]) is None and pc.lookup([1, 1, 1, 0]) is not None
    assert not pc.store(_entry([5], nbytes=301)) and pc.rejected == 1
    pc.reset()
    assert len(pc) == 0 and pc.bytes == 0 and pc.published["entries"] == 0


def test_a_block_entry_is_unindexed_when_evicted() -> None:
    pc = PromptCache(150, block=2)
    pc.store(_entry([1, 2, 3, 4, 5]))
    pc.store(_entry([9, 9, 9, 9, 9]))
    assert pc.evictions == 1 and pc.lookup([1, 2, 3, 4, 8, 8]) is None
    assert all(set(owners) <= set(pc._entries) for owners in pc._blocks.values())


def test_pins_hold_at_most_their_share_and_the_oldest_pin_falls_back_to_lru() -> None:
    pc = PromptCache(1000, block=4)
    pc.store(_entry([1], nbytes=300, pinned=True))
    pc.store(_entry([2], nbytes=300, pinned=True))  # 600 > half the bound: [1] is unpinned
    assert [e.pinned for e in pc._entries.values()] == [False, True] and pc.stats()["pinned_bytes"] == 300
    pc.store(_entry([3], nbytes=501, pinned=True))  # over the share on its own: a plain entry
    assert pc._entries[(3,)].pinned is False and pc.evictions == 1  # [1], now plain LRU, made room
    pc.store(_entry([2], nbytes=300, kind="ckpt"))  # a repeated store keeps the pin
    assert pc._entries[(2,)].pinned and pc._entries[(2,)].kind == "ckpt"


ops = st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 3), min_size=1, max_size=24),
                         st.integers(1, 400), st.booleans(), st.booleans()), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_bytes_never_exceed_the_bound(seq: list[tuple[bool, list[int], int, bool, bool]]) -> None:
    pc = PromptCache(1000, block=4)
    for is_store, tokens, nbytes, trimmable, pinned in seq:
        before, evicted = set(pc._entries), pc.evictions
        if is_store:
            pc.store(_entry(tokens, nbytes, trimmable, pinned=pinned))
        else:
            hit = pc.lookup(tokens)
            if hit is not None:
                assert 0 < hit.tokens < len(tokens)
                assert tuple(tokens[:hit.tokens]) == hit.entry.tokens[:hit.tokens]
                assert hit.tokens == len(hit.entry.tokens) or hit.entry.trimmable
        assert pc.evictions - evicted == len(before - set(pc._entries))  # every entry that left was counted
        assert pc.bytes == sum(e.nbytes for e in pc._entries.values()) <= pc.max_bytes
        assert sum(e.nbytes for e in pc._entries.values() if e.pinned) <= pc.max_bytes * PIN_SHARE
        assert pc.published == pc.stats()  # what other threads read is current
        assert sum(pc._lengths.values()) == len(pc)
        assert all(owners and set(owners) <= set(pc._entries) for owners in pc._blocks.values())
    s = pc.stats()
    assert s["stores"] - s["evictions"] == s["entries"]


def test_a_queued_prompt_expects_what_ram_holds_or_a_prefix_shared_ahead() -> None:
    from gmlx_server.engine.cache_tiers import CacheTiers

    tiers = CacheTiers(PromptCache(10_000, block=4))
    prompt = list(range(200))
    assert tiers.expected(prompt, []) == 0
    assert tiers.expected(prompt, [[*range(150), 7, 7]]) == 150  # stored once that prompt's prefill ends
    assert tiers.expected(prompt, [list(range(30))]) == 0  # under one 64-token cache block: nothing reused
    assert tiers.expected(prompt, [prompt]) == 199  # the same prompt ahead: one token is always prefilled
    tiers.store(_entry(list(range(180))))
    assert tiers.expected(prompt, [[*range(150), 7]]) == 180  # RAM holds more than the one ahead shares
