"""rapid.runtime.telemetry: the summary's split of the first verdict from the decoding after it."""

from __future__ import annotations

import pytest

from rapid.runtime.telemetry import RoundRecord, summarize, time_per_output_token


def test_time_per_output_token_is_every_token_after_the_first_over_the_time_after_it():
    assert time_per_output_token(10.0, 2.0, 17) == pytest.approx(0.5)
    assert time_per_output_token(10.0, None, 17) is None  # no first verdict
    assert time_per_output_token(10.0, 2.0, 1) is None  # no second token
    assert time_per_output_token(2.0, 2.0, 5) is None  # no time after the first


def test_the_summary_line_says_both_halves_only_when_there_are_two():
    recs = [RoundRecord(0, "rapid", 2, 4, accepted=2, emitted=3), RoundRecord(1, "rapid", 2, 4, accepted=1, emitted=2)]
    s = summarize("rapid", recs, 5, 3.0, ttft_s=1.0)
    assert s.decode_tok_s() == pytest.approx(2.0)  # 4 tokens in the 2 s after the first verdict
    assert "(1.67 tok/s; first tokens after 1.00s, then 2.00 tok/s)" in s.line()
    assert "first tokens" not in summarize("rapid", recs, 5, 3.0).line()  # no first verdict timed
