"""Keyword search: a BM25 index of each user's fact texts (SQLite FTS5, in memory).

Each user's texts live in their own in-memory SQLite database (an FTS5 table, Porter stemming
over unicode61 tokens), so a user's search reads only that user's facts and BM25's statistics
(document frequencies, lengths) are the user's own. The index holds no durable state: like the
vector index it is rebuilt from the store at start-up, and RetrievalIndex (index.py) adds and
removes a fact in both in the same call, under one lock. Why FTS5 (and not bm25s or the
store's own full-text search): docs/memory.md#keyword-search.

A query is read as the OR of its words, without stopwords: a fact matching any word is a
candidate, ranked by BM25 (Okapi, k1=1.2, b=0.75, FTS5's bm25()). FTS5 scores every fact that
matches, so in a large memory a query's words are matched rarest first, up to MAX_POSTINGS
(fact, word) matches: the commonest words, whose BM25 weight is the lowest, are left out.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence

from inferscale_engine.facts import FactId

_WORD = re.compile(r"[^\W_]+")
STOPWORDS = frozenset("""
a an the is are was were be been being am of to in on at for and or but nor with what when where
who whom whose which why how did do does doing done has have had having i me you he him she it
they them we us my mine your yours his her hers their theirs its our ours as by from that this
these those about into than then there here not no so if can could would should will shall may
might must just also very too any some all each both either neither one ever
""".split())
"""Words a query does not match on (they are in most facts)."""
MAX_POSTINGS = 500
"""Most (fact, word) matches one search scores: its cost, whatever the user's facts
(docs/benchmarks.md#keyword-search). Below it, every word of the query is matched. LoCoMo's
dev recall is the same at 500, 1,000, 2,000 and 10,000 (its users hold ~400 facts; the words
left out are the commonest, which BM25 weighs least). On a GPU, 500 keeps the keyword query of
a 100k-fact user under half a millisecond (10,000: 4 ms), so hybrid search stays within 2x of
vector search there."""


def query_terms(query: str) -> list[str]:
    """The words keyword search matches: lowercased, no stopwords or single letters, once."""
    words = (w.lower() for w in _WORD.findall(query))
    return list(dict.fromkeys(w for w in words if len(w) > 1 and w not in STOPWORDS))


class LexicalIndex:
    """Per user, an FTS5 table of fact texts; BM25 top-k.

    Not thread-safe on its own: RetrievalIndex serializes access.
    """

    def __init__(self) -> None:
        self._users: dict[str, sqlite3.Connection] = {}
        self._ids: dict[str, set[int]] = {}
        """Indexed fact ids per user."""

    def add(self, user_id: str, fact_ids: Sequence[int], texts: Sequence[str]) -> None:
        """Index texts (one per fact id); an id already indexed gets the new text."""
        if not fact_ids:
            return
        db = self._users.get(user_id)
        if db is None:
            db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            db.execute("CREATE VIRTUAL TABLE facts USING fts5(text, "
                       "tokenize='porter unicode61')")
            self._users[user_id], self._ids[user_id] = db, set()
        known = self._ids[user_id]
        with db:
            db.executemany("DELETE FROM facts WHERE rowid = ?",
                           [(f,) for f in fact_ids if f in known])
            db.executemany("INSERT INTO facts(rowid, text) VALUES (?, ?)",
                           zip(fact_ids, texts, strict=True))
        known.update(fact_ids)

    def remove(self, user_id: str, fact_ids: Iterable[int]) -> None:
        """Unindex facts; ids not indexed are skipped. A user left with none is dropped."""
        known = self._ids.get(user_id)
        if known is None:
            return
        gone = [f for f in dict.fromkeys(fact_ids) if f in known]
        db = self._users[user_id]
        with db:
            db.executemany("DELETE FROM facts WHERE rowid = ?", [(f,) for f in gone])
        known.difference_update(gone)
        if not known:
            self.drop_user(user_id)

    def drop_user(self, user_id: str) -> None:
        """Forget a user's texts (no-op for an unknown user)."""
        db = self._users.pop(user_id, None)
        self._ids.pop(user_id, None)
        if db is not None:
            db.close()

    def count(self, user_id: str) -> int:
        """The user's indexed facts."""
        return len(self._ids.get(user_id, ()))

    def search(self, user_id: str, query: str, k: int) -> list[tuple[FactId, float]]:
        """The user's k best (fact id, BM25 > 0) for the query's words, best first.

        Equal scores rank by smaller fact id; [] when no fact has a word of the query.
        """
        db = self._users.get(user_id)
        terms = ['"' + t.replace('"', '""') + '"' for t in query_terms(query)]
        if db is None or not terms or k <= 0:
            return []
        if len(terms) * self.count(user_id) > MAX_POSTINGS:
            terms = _rarest(db, terms)
        if not terms:
            return []
        match = " OR ".join(terms)
        rows = db.execute("SELECT rowid, -bm25(facts) AS score FROM facts WHERE facts MATCH ? "
                          "ORDER BY score DESC, rowid LIMIT ?", (match, k)).fetchall()
        return [(FactId(f), float(s)) for f, s in rows]


def _rarest(db: sqlite3.Connection, terms: list[str]) -> list[str]:
    """The rarest of the quoted terms whose matches add up to at most MAX_POSTINGS."""
    count = ("SELECT count(*) FROM (SELECT 1 FROM facts WHERE facts MATCH ? LIMIT "
             f"{MAX_POSTINGS + 1})")
    kept, total = [], 0
    for matches, term in sorted((db.execute(count, (t,)).fetchone()[0], t) for t in terms):
        if total + matches > MAX_POSTINGS:
            break
        if matches:
            kept.append(term)
            total += matches
    return kept
