"""rapid.runtime.depth_control: the depth a round runs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rapid.runtime.depth_control import carried_by_chain, observed_depth, round_depth


@given(decided=st.integers(0, 8), left=st.integers(1, 64), kept=st.integers(0, 8))
def test_round_depth_never_drafts_a_level_the_bonus_token_supplies(decided, left, kept):
    """A verdict emits its accepted path and then the target's bonus token, so with ``left`` tokens
    to go level ``left`` could only repeat the bonus: the decision is capped at ``left - 1``."""
    depth = round_depth(decided, left, kept)
    if decided == 0 or left == 1:
        assert depth == kept  # a round that drafts nothing (rapid-cost, or the bonus token alone is left)
    else:
        assert depth == max(1, kept, min(decided, left - 1))


def test_round_depth_examples():
    assert round_depth(4, 64, 0) == 4
    assert round_depth(4, 3, 0) == 2  # levels 1-2, then the bonus: the 3 tokens left
    assert round_depth(4, 2, 0) == 1  # at least one step for a drafting decision
    assert round_depth(4, 1, 0) == 0  # but none whose nodes could not be sent: the bonus is the last token
    assert round_depth(2, 64, 3) == 3  # the kept branch's levels are never thrown away
    assert round_depth(0, 64, 0) == 0


def test_observed_depth_is_the_levels_a_round_could_send():
    assert observed_depth(4, 64) == 4
    assert observed_depth(5, 3) == 2  # a kept branch's levels past left - 1 are cut before the send
    assert observed_depth(1, 1) == 0  # one token left: nothing sent, no sample


def test_only_a_verdict_past_the_drafted_levels_is_carried_by_a_chain():
    assert carried_by_chain(5, 4) and carried_by_chain(1, 0)
    assert not carried_by_chain(4, 4) and not carried_by_chain(0, 3)
