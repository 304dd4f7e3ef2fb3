"""`hlo_collectives.collective_bytes` on a hand-written HLO module: loops count their trip
count, conditionals their cheapest / costliest branch, every collective by its result."""

import pytest

from sgl_jax_rollout_apps.bench.hlo_collectives import collective_bytes

HLO = """HloModule m, entry_computation_layout={(f32[4,25]{1,0})->f32[4,100]{1,0}}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %r = f32[8]{0} all-reduce(%x), channel_id=1, to_apply=%add
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %r)
}

%cond (p.1: (s32[], f32[8])) -> pred[] {
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%branch_a (q: f32[4,25]) -> f32[4,100] {
  ROOT %g = f32[4,100]{1,0} all-gather(%q), channel_id=2, dimensions={1}
}

%branch_b (q.1: f32[4,25]) -> f32[4,100] {
  ROOT %pad = f32[4,100]{1,0} pad(%q.1, %zero), padding=0_0x0_75
}

ENTRY %main (x: f32[4,25]) -> f32[4,100] {
  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body, TRIP_COUNT
  %s = s32[4,2]{1,0} all-gather(%z), channel_id=3, dimensions={1}
  ROOT %k = f32[4,100]{1,0} conditional(%pred, %x, %x), branch_computations={%branch_a, %branch_b}
}
""".replace("TRIP_COUNT", 'backend_config={"known_trip_count":{"n":"32"}}')


def test_loops_branches_and_collectives_are_counted():
    # while: 32 x f32[8] = 1024; s32[4,2] = 32; the all-gather branch f32[4,100] = 1600 or 0
    assert collective_bytes(HLO) == {"min_per_call": 1056, "max_per_call": 2656, "collectives": 3}


def test_a_loop_without_a_known_trip_count_is_refused():
    with pytest.raises(ValueError, match="known trip count"):
        collective_bytes(HLO.replace(', backend_config={"known_trip_count":{"n":"32"}}', ""))
