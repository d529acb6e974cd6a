"""n-gram speculative decoding (core/speculation.py), its parts alone: the drafts proposed, the draft length,
the configuration's checks. On the real model against the session stack: tests/test_speculation_stack.py."""

from __future__ import annotations

import re

import pytest

from engine_service.core.speculation import SpeculativeConfig, draft_length, propose


def test_a_draft_is_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix() -> None:
    config = SpeculativeConfig()
    assert propose([1, 2, 3, 4, 5, 9, 9, 1, 2, 3], config, 4) == [4, 5, 9, 9], "3-gram 1 2 3"
    assert propose([5, 6, 1, 2, 7, 8, 1, 2, 3, 1, 2], config, 3) == [3, 1, 2], "the latest 1 2, not the first"
    assert propose([1, 2, 3, 4, 5], config, 4) == [], "no earlier occurrence"
    assert propose([7, 7], config, 4) == [], "shorter than prompt_lookup_min + 1"
    assert propose([1, 2, 1, 2], config, 0) == []
    # Byte patterns must match on token boundaries: 256 = 00 01 00 00 and 1 = 01 00 00 00 overlap.
    assert propose([256, 1, 0, 0, 5, 1, 0], SpeculativeConfig(prompt_lookup_min=2), 2) == [0, 5]


def test_the_draft_length_grows_with_acceptance_and_shrinks_with_the_batch() -> None:
    lengths = [draft_length(rate, 1, 0.25, 4) for rate in (0.1, 0.3, 0.5, 0.7, 0.95)]
    assert lengths == sorted(lengths) and lengths[0] == 0 and lengths[-1] == 4
    assert draft_length(0.7, 8, 0.25, 4) < draft_length(0.7, 1, 0.25, 4)
    assert draft_length(0.99, 1, 0.25, 2) == 2, "never more than allowed"


@pytest.mark.parametrize("text, error", [
    ('{"method": "eagle"}', "method must be one of ngram"),
    ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be from 1"),
    ('{"prompt_lookup_min": 5, "prompt_lookup_max": 3}', "prompt_lookup_min <= prompt_lookup_max"),
    ('{"draft_model": "x"}', "unknown key(s) ['draft_model']"),
    ('{"num_speculative_tokens": "4"}', "must be an integer"),
    ("ngram", "is not JSON"),
])
def test_a_bad_speculative_config_is_refused_naming_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=re.escape(error)):
        SpeculativeConfig.parse(text)


def test_prompt_lookup_max_alone_bounds_the_minimum() -> None:
    assert SpeculativeConfig.parse('{"prompt_lookup_max": 1}').prompt_lookup_min == 1
