"""Dated facts: a fact's date written into its tokens, for kv and text mode alike.

With Memory(date_facts=True) every fact is served as '[8 May 2023] <text>': the day it became
true (add()'s timestamp, else when it was added; UTC). The label is part of the token ids the
KV is encoded from, so a kv prompt and a text prompt hold exactly the same words; the text a
fact is stored, embedded, searched and returned with stays the text that was added.

Every path that tokenizes a fact goes through FactDates: adds (sync and queued), update,
supersede, import and the start-up rebuild (the store's fingerprint names the setting, so a
store opened with the other setting has its token ids recomputed).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from inferscale_engine.errors import ConfigError
from inferscale_engine.facts import Fact

Tokenize = Callable[..., tuple[int, ...]]


def date_label(when: float) -> str:
    """'[8 May 2023] ' for a time (seconds since the epoch), the day in UTC."""
    day = datetime.fromtimestamp(when, tz=UTC)
    return f"[{day.day} {day:%B %Y}] "


class FactDates:
    """How facts are written for the model: with their date (on) or as added (off)."""

    def __init__(self, tokenize_fact: Tokenize, on: bool) -> None:
        if not isinstance(on, bool):
            raise ConfigError(f"date_facts={on!r:.40} must be True or False")
        self.on = on
        self._tokenize_fact = tokenize_fact

    def text(self, text: str, when: float | None) -> str:
        """The fact as the model reads it (when None: now)."""
        if not self.on:
            return text
        return date_label(time.time() if when is None else when) + text

    def tokens(self, text: str, when: float | None, *, check_length: bool = True
               ) -> tuple[int, ...]:
        """The fact's token ids as prompts hold them (InvalidFactError: blank or too long)."""
        if not text.strip():  # a blank text is refused as blank, not hidden behind a label
            return self._tokenize_fact(text, check_length=check_length)
        return self._tokenize_fact(self.text(text, when), check_length=check_length)

    def tokenizer(self, when: float | None) -> Callable[[str], tuple[int, ...]]:
        """tokens() of facts that became true at `when` (None: now, read once)."""
        at = time.time() if when is None and self.on else when
        return lambda text: self.tokens(text, at)

    def served(self, fact: Fact, when: float | None) -> Fact:
        """The Fact the engine serves: its text as the model reads it (a user block)."""
        if not self.on:
            return fact
        return Fact(fact.fact_id, fact.user_id, self.text(fact.text, when), fact.token_ids)
