"""bench/caching_allocator.py's rules on hand-worked sequences (sizes in MiB unless said)."""
import pytest

from bench.allocator_replay import snapshot_events
from bench.caching_allocator import CachingAllocator, allocation_size, replay, replay_steps, round_size

MIB = 2 ** 20


def test_requests_round_to_512_bytes_and_segments_to_the_pool_sizes():
    assert round_size(1) == 512
    assert round_size(513) == 1024
    assert allocation_size(MIB) == 2 * MIB  # small pool: kSmallBuffer
    assert allocation_size(MIB + 512) == 20 * MIB  # 1-10 MiB: kLargeBuffer
    assert allocation_size(11 * MIB + 512) == 12 * MIB  # >= 10 MiB: rounded up to kRoundLarge


def test_a_small_request_splits_a_2_mib_segment_and_the_next_one_reuses_it():
    a = CachingAllocator()
    x = a.malloc(100)
    y = a.malloc(1000)
    assert (x.size, y.size) == (512, 1024)
    assert (x.segment, y.segment, y.offset) == (0, 0, 512)
    assert a.reserved == 2 * MIB
    assert a.allocated == 1536


def test_a_large_remainder_of_1_mib_or_less_is_not_split_and_counts_as_allocated():
    a = CachingAllocator()
    x = a.malloc(11 * MIB)  # 12 MiB segment, 1 MiB left: not > kSmallSize
    assert x.size == 12 * MIB
    assert a.allocated == 12 * MIB
    a.free(x)
    y = a.malloc(10 * MIB)  # 2 MiB left: split, the request takes the start
    assert (y.segment, y.offset, y.size) == (0, 0, 10 * MIB)
    assert a.allocated == 10 * MIB
    assert a.reserved == 12 * MIB


def test_best_fit_takes_the_smallest_cached_block_that_fits():
    a = CachingAllocator()
    big, small = a.malloc(50 * MIB), a.malloc(30 * MIB)
    a.free(big)
    a.free(small)
    x = a.malloc(25 * MIB)
    assert x.segment == small.segment
    y = a.malloc(40 * MIB)
    assert y.segment == big.segment
    assert a.reserved == 80 * MIB


def test_freed_neighbours_merge_so_the_whole_segment_serves_again():
    a = CachingAllocator()
    seg = a.malloc(60 * MIB)
    a.free(seg)
    x, y, z = a.malloc(20 * MIB), a.malloc(20 * MIB), a.malloc(20 * MIB)
    assert {b.segment for b in (x, y, z)} == {0}
    assert [b.offset for b in (x, y, z)] == [0, 20 * MIB, 40 * MIB]
    a.free(x)
    a.free(z)
    a.free(y)  # merges with both neighbours
    w = a.malloc(60 * MIB)
    assert (w.segment, w.offset, w.size) == (0, 0, 60 * MIB)
    assert a.reserved == 60 * MIB


def test_a_request_no_cached_block_fits_gets_a_new_segment_and_the_remainder_stays_reserved():
    # plan/allocator.py's stranded case: T1 freed, T2 carved from it, T1 again while T2 lives.
    events = [("alloc", 0, 100 * MIB), ("free", 0, 0), ("alloc", 1, 60 * MIB), ("alloc", 2, 100 * MIB),
              ("free", 1, 0), ("free", 2, 0)]
    a = replay(events)
    assert a.segments == [100 * MIB, 100 * MIB]
    assert a.peak_allocated == 160 * MIB
    assert a.peak_reserved == 200 * MIB
    assert a.allocated == 0
    assert a.reserved == 200 * MIB


def test_small_and_large_pools_do_not_share_blocks():
    a = CachingAllocator()
    big = a.malloc(20 * MIB)
    a.free(big)
    x = a.malloc(4096)
    assert x.segment == 1
    assert a.reserved == 22 * MIB


def test_a_stream_takes_no_block_cached_by_another():
    a = CachingAllocator()
    x = a.malloc(40 * MIB, 8)
    a.free(x)
    y = a.malloc(40 * MIB, 7)  # stream 8's cached block is the only one: not taken
    z = a.malloc(40 * MIB, 8)
    assert (y.segment, z.segment) == (1, 0)
    assert a.segments == [40 * MIB, 40 * MIB]


def test_empty_cache_releases_only_wholly_free_segments():
    a = CachingAllocator()
    x, y = a.malloc(30 * MIB), a.malloc(50 * MIB)
    a.free(y)
    z = a.malloc(20 * MIB)  # split from y's segment: it is not wholly free
    a.free(x)
    a.empty_cache()
    assert a.reserved == 50 * MIB
    a.free(z)
    a.empty_cache()
    assert a.reserved == 0
    assert a.peak_reserved == 80 * MIB


def test_a_recorded_trace_reads_as_events_and_its_reserved_peak():
    # torch.cuda.memory._dump_snapshot's device_traces entries (TraceEntry: action, addr, size, stream)
    trace = [{"action": "segment_alloc", "addr": 0, "size": 100 * MIB, "stream": 0},
             {"action": "alloc", "addr": 0, "size": 100 * MIB, "stream": 0},
             {"action": "free_requested", "addr": 0, "size": 100 * MIB, "stream": 0},
             {"action": "free_completed", "addr": 0, "size": 100 * MIB, "stream": 0},
             {"action": "segment_free", "addr": 0, "size": 100 * MIB, "stream": 0},
             {"action": "segment_alloc", "addr": 0, "size": 60 * MIB, "stream": 0},
             {"action": "alloc", "addr": 0, "size": 60 * MIB, "stream": 0}]
    events, peak = snapshot_events({"device_traces": [trace]})
    assert events == [("alloc", 0, 100 * MIB, 0), ("free", 0, 0), ("empty_cache", 0, 0), ("alloc", 3, 60 * MIB, 0)]
    assert peak == 100 * MIB
    a = replay(events)
    assert a.reserved == 60 * MIB
    assert a.peak_reserved == 100 * MIB


def test_a_recorded_run_gives_each_step_its_peaks_and_initialisation_segments_stay_reserved():
    # initialisation: a 100 MiB temporary, freed; a state that stays. Step 1 carves a 60 MiB block out of the cached
    # 100 MiB and keeps it (the optimizer's lazily created state); step 2's 100 MiB then needs a new segment.
    events = [("alloc", 0, 100 * MIB), ("alloc", 1, 20 * MIB), ("free", 0, 0), ("init_end", 0, 0),
              ("alloc", 2, 60 * MIB), ("step_end", 0, 0),
              ("alloc", 3, 100 * MIB), ("free", 3, 0), ("step_end", 0, 0)]
    steps = replay_steps(events)
    assert steps == [(80 * MIB, 120 * MIB), (180 * MIB, 220 * MIB)]


# torch's MemTracker warns on a module output that holds None (the layer's attention weights: not returned)
@pytest.mark.filterwarnings("ignore:Expected a tensor or a traceable wrapper-subclass:UserWarning")
def test_a_published_max_length_rows_step_replays_against_what_the_card_had_left(capsys):
    """`--corpus`: A1's baseline step at 32,000 tokens (the untiled loss's fp32 logits, the largest transients in the
    corpus) fragments the cache beyond the planner's stranded term; the columns add up."""
    from bench.allocator_replay import corpus_rows

    corpus_rows(["A1-max"], layers=2)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("A1-max"))
    cells = line.split()
    assert cells[1] == "32,000"
    replay_a, replay_r, gap, stranded, beyond, left = (float(x) for x in cells[2:8])
    assert replay_r > replay_a
    assert abs(gap - (replay_r - replay_a)) < 0.02
    assert abs(beyond - (gap - stranded)) < 0.02
    assert beyond > 0
    assert left > beyond
