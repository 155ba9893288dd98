"""rapid.runtime.detok: streamed pieces concatenate to the full decode, no split characters."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from rapid.runtime.detok import Detokenizer
from rapid.tiny import EOS_ID, write_tokenizer

FFFD = "\ufffd"
SPECIAL = [EOS_ID, EOS_ID + 1, EOS_ID + 2]  # <|endoftext|>, <|im_start|>, <|im_end|>


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("detok_tok")
    write_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)


def stream(tok, ids: list[int], chunks: list[int], skip: bool = True) -> list[str]:
    """Push ``ids`` in chunks of the given sizes (cycled), then flush; return all pieces."""
    d = Detokenizer(tok, skip_special_tokens=skip)
    pieces, pos, c = [], 0, 0
    while pos < len(ids):
        size = chunks[c % len(chunks)] if chunks else 1
        c += 1
        pieces.append(d.push(ids[pos:pos + size]))
        # what has been sent so far is always a prefix of the final text
        assert tok.decode(ids, skip_special_tokens=skip).startswith("".join(pieces))
        pos += size
    pieces.append(d.flush())
    return pieces


def test_byte_tokenizer_round_trips(tok):
    text = "héllo, wörld € 😀 ∑ 中文"
    ids = list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(ids + [EOS_ID], skip_special_tokens=True) == text


multibyte = st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters=FFFD),
                    max_size=40)


@settings(max_examples=150, deadline=None)
@given(text=multibyte, chunks=st.lists(st.integers(1, 4), max_size=5))
def test_streaming_random_utf8_text(tok, text, chunks):
    ids = list(text.encode("utf-8"))
    full = tok.decode(ids, skip_special_tokens=True)
    assert full == text
    pieces = stream(tok, ids, chunks)
    assert "".join(pieces) == full
    assert not any(FFFD in p for p in pieces)


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.one_of(multibyte.map(lambda s: list(s.encode("utf-8"))),
                                st.sampled_from(SPECIAL).map(lambda t: [t])), max_size=8))
def test_streaming_with_special_tokens(tok, parts):
    ids = [t for p in parts for t in p]
    for skip in (True, False):
        full = tok.decode(ids, skip_special_tokens=skip)
        pieces = stream(tok, ids, [1], skip=skip)
        assert "".join(pieces) == full
        if FFFD not in full:
            assert not any(FFFD in p for p in pieces)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=30), chunks=st.lists(st.integers(1, 3), max_size=4))
def test_streaming_arbitrary_bytes(tok, data, chunks):
    """Invalid UTF-8 decodes to U+FFFD; the concatenation still equals the full decode."""
    ids = list(data)
    full = tok.decode(ids)
    pieces = stream(tok, ids, chunks)
    assert "".join(pieces) == full
    if FFFD not in full:
        assert not any(FFFD in p for p in pieces)


def test_incomplete_character_is_held_back(tok):
    d = Detokenizer(tok)
    euro = list("€".encode())  # 3 bytes
    assert d.push([ord("a")]) == "a"
    assert d.push(euro[:1]) == ""
    assert d.push(euro[1:2]) == ""
    assert d.push(euro[2:]) == "€"
    assert d.push([]) == ""
    assert d.flush() == ""
    # an incomplete tail is emitted by flush as the replacement character
    d = Detokenizer(tok)
    assert d.push([ord("b"), 0xF0, 0x9F]) == ""
    assert d.flush() == "b" + FFFD
    assert d.flush() == ""


def test_decoding_work_is_linear_in_the_output(tok):
    """Each push decodes a bounded window, not the whole sequence (it was quadratic)."""
    decoded = []

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            decoded.append(len(ids))
            return tok.decode(ids, skip_special_tokens=skip_special_tokens)

    text = "streamed text with multi-byte characters: é ü € 😀 中文 " * 40
    ids = list(text.encode("utf-8"))
    d = Detokenizer(Counting())
    pieces = [d.push([i]) for i in ids]
    before_flush = sum(decoded)
    pieces.append(d.flush())
    assert "".join(pieces) == text
    assert before_flush <= 12 * len(ids)  # a full re-decode per token would be ~len(ids)² / 2
