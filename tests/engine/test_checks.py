"""The one input checker: visible text, user ids (NFC, no control characters), same_text."""

from __future__ import annotations

import unicodedata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inferscale_engine import checks
from inferscale_engine.errors import InvalidFactError, InvalidUserIdError
from inferscale_engine.memory.ingest import find_duplicates
from inferscale_engine.memory.search.index import RetrievalIndex

INVISIBLE = ["\u200b", "\u200d", "\ufeff", "\u200b\u200b\u200b\u200c", " \t\n", "\u2060",
             "\u00ad", "\u3164", "\ufe0f", "\u034f", "\u2800", "\U000e0041"]


@pytest.mark.parametrize("text", INVISIBLE)
def test_invisible_only_text_is_refused_like_empty_text(text):
    with pytest.raises(InvalidFactError, match="empty or has no visible character"):
        checks.check_text(text, "texts[0]")
    with pytest.raises(InvalidFactError, match="empty or has no visible character"):
        checks.check_text("", "texts[0]")


@pytest.mark.parametrize("text", ["🎉🎉", "🐍", "a\u200bb", "  x ", "日本", "مرحبا", "é", "1"])
def test_visible_text_is_kept_stripped(text):
    assert checks.check_text(text, "t") == text.strip()


def test_user_ids_are_nfc_and_printable():
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    assert nfc != nfd and checks.check_user_id(nfd) == checks.check_user_id(nfc) == nfc
    for bad in ["user\x00x", "a\nb", "\x7f", "tab\there"]:
        with pytest.raises(InvalidUserIdError, match="control character"):
            checks.check_user_id(bad)
    for bad in ["", "  ", "\u200b", b"alice", 7, None, "\ud800"]:
        with pytest.raises(InvalidUserIdError):
            checks.check_user_id(bad)


@pytest.mark.parametrize("a,b,same", [
    ("Alice lives in Lisbon.", "alice lives in lisbon", True),
    ("Alice  lives\tin Lisbon!", "Alice lives in Lisbon", True),
    ("ﬁne", "fine", True),  # NFKC
    ("🎉🎉", "🚀🚀", False),
    ("🐍", "😀", False),
    ("Alice is 31.", "Alice is 32.", False),
    ("Alice's dog is Pepper", "Alice's cat is Pepper", False),
    ("\u200bhello", "hello", True),
])
def test_same_text(a, b, same):
    assert checks.same_text(a, b) is same


visible_texts = st.text(
    alphabet=st.one_of(
        st.characters(categories=["L", "N", "P", "S", "M", "Zs"]),
        st.sampled_from(["\u200b", "\u200d", "\ufeff", "\u200c", "\u05d0", "\u0627", "\u0301",
                         "🎉", "🚀", "🐍", "😀", "👩", "💻", "日", "本", "ß", "İ"])),
    min_size=1, max_size=12).filter(checks.has_visible)


@settings(max_examples=400, deadline=None)
@given(st.lists(visible_texts, min_size=1, max_size=6), st.lists(visible_texts, max_size=6))
def test_embedding_alone_never_reports_a_duplicate(existing, new):
    # The worst embedder: every text gets the same vector (cosine 1.0 between all of them).
    index = RetrievalIndex(device="cpu")
    vector = torch.ones(1, 8) / 8 ** 0.5
    index.add(user_id="u", fact_ids=list(range(1, len(existing) + 1)),
              embeddings=vector.repeat(len(existing), 1))
    texts = {i + 1: t for i, t in enumerate(existing)}
    matches = find_duplicates(index, "u", vector.repeat(len(new), 1), 0.95, new, texts.get)
    for i, (text, match) in enumerate(zip(new, matches, strict=True)):
        if match is None:
            assert not any(checks.same_text(text, t) for t in existing + new[:i])
            continue
        target, score = match
        assert score >= 0.95
        other = new[target[0]] if isinstance(target, tuple) else texts[target]
        assert checks.same_text(other, text), (text, other)


def test_the_ascii_fast_path_of_user_ids_agrees_with_the_full_check():
    # check_user_id returns printable ASCII ids at once; every ASCII id must get the answer
    # the full check gives it.
    def full(user_id: str) -> str | None:
        if any(unicodedata.category(c) == "Cc" for c in user_id) or not checks.has_visible(
                user_id):
            return None
        return unicodedata.normalize("NFC", user_id)

    candidates = [chr(i) for i in range(128)] + [" a", "a b", "  ", "", "alice\t", "bob\x7f",
                                                  "user-42@example.com"]
    for user_id in candidates:
        want = full(user_id)
        if want is None:
            with pytest.raises(InvalidUserIdError):
                checks.check_user_id(user_id)
        else:
            assert checks.check_user_id(user_id) == want, repr(user_id)
