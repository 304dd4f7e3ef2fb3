"""`completion_text`: held-back stop ids left out, and the text ended before the first stop
string it holds where the call trims (the default); `SamplingOptions.trimmed_stops` says which.
`Chars` is a test double of the tokenizer: one character per id."""

from __future__ import annotations

from sgl_jax_rollout.rollout_output import completion_text
from sgl_jax_rollout.sampling.options import SamplingOptions


class Chars:
    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_the_text_ends_before_the_first_stop_string_it_holds():
    ids = [ord(c) for c in "answer: 42<END>more"]
    assert completion_text(Chars(), ids, set()) == "answer: 42<END>more"
    assert completion_text(Chars(), ids, set(), ("<END>", ": ")) == "answer"
    assert completion_text(Chars(), ids, set(), ("##",)) == "answer: 42<END>more"
    assert completion_text(Chars(), ids, {ord("4")}, ("<END>",)) == "answer: 2"


def test_either_peers_option_keeps_the_stop_string():
    assert SamplingOptions(stop=["x", "y"]).trimmed_stops == ("x", "y")
    assert SamplingOptions(stop=["x"], no_stop_trim=True).trimmed_stops == ()
    assert SamplingOptions(stop=["x"], include_stop_str_in_output=True).trimmed_stops == ()
