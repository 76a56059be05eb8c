"""Keyword search: a BM25 index of each user's fact texts (SQLite FTS5, in memory).

Each user's texts live in their own in-memory SQLite database (an FTS5 table, Porter stemming
over unicode61 tokens), so a user's search reads only that user's facts and BM25's statistics
(document frequencies, lengths) are the user's own. The index holds no durable state: like the
vector index it is rebuilt from the store at start-up, and RetrievalIndex (index.py) adds and
removes a fact in both in the same call, under one lock. Why FTS5 (and not bm25s or the
store's own full-text search): docs/memory.md#keyword-search.

A fact's keyword document has two columns: its own text, and its context. The context is
empty unless keyword context is on (Memory(keyword_context=True); off by default); then it
holds the texts of the CONTEXT_FACTS facts of the same user and session indexed right before
it (by fact id, i.e. in the order they were added; facts without a session are one session).
Deleted and superseded facts are out of the index, so a context names live facts only:
removing a fact rewrites the contexts that held it. A conversation's answer is often split
over turns ("Did you go?" / "Yes, last Friday"): the reply shares no word with the question,
its context does. A column of its own (not the context appended to the text) gives the
context its own BM25 weight (docs/memory.md#keyword-context).

A query is read as the OR of its words, without stopwords: a fact matching any word is a
candidate, ranked by BM25 (Okapi, k1=1.2, b=0.75, FTS5's bm25()) over both columns, its context
weighted CONTEXT_WEIGHT. FTS5 scores every fact that matches, so in a large memory a query's
words are matched rarest first, up to MAX_POSTINGS (fact, word) matches: the commonest words,
whose BM25 weight is the lowest, are left out.
"""

from __future__ import annotations

import bisect
import re
import sqlite3
from collections.abc import Iterable, Sequence

from inferscale_engine.errors import ConfigError
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

CONTEXT_FACTS = 2
"""Facts before a fact whose texts are its keyword context, with keyword context on
(Memory(keyword_context=True); LexicalIndex's context_facts). On the LoCoMo dev fold (turn
facts, hybrid, k=20) 1 fact gave evidence recall 79.7%, 2 gave 80.2% (none: 74.8%);
docs/benchmarks.md#keyword-context."""
CONTEXT_WEIGHT = 0.7
"""BM25 weight of a fact's context column against its own text's 1.0 (0: not matched), read
at each search. Dev fold recall at k=5/10/20: 0.5 65.2/75.3/80.0%, 0.7 65.9/77.1/80.4%, 1.0
65.4/75.3/80.2%, 1.5 65.2/74.0/80.2%. A word in a fact's context counts 0.7 of one in its
text (BM25's length normalization still favours short facts)."""


def context_facts(keyword_context: object) -> int:
    """The context_facts of a keyword_context setting: CONTEXT_FACTS if on, else 0."""
    if not isinstance(keyword_context, bool):
        raise ConfigError(f"keyword_context={keyword_context!r} must be True or False")
    return CONTEXT_FACTS if keyword_context else 0


def query_terms(query: str) -> list[str]:
    """The words keyword search matches: lowercased, no stopwords or single letters, once."""
    words = (w.lower() for w in _WORD.findall(query))
    return list(dict.fromkeys(w for w in words if len(w) > 1 and w not in STOPWORDS))


class LexicalIndex:
    """Per user, an FTS5 table of fact texts and their contexts; BM25 top-k.

    A fact's context comes from the facts of its group (its session; None is a group too).
    Not thread-safe on its own: RetrievalIndex serializes access.
    """

    def __init__(self, context_facts: int = 0) -> None:
        """context_facts: facts before a fact whose texts are its keyword context (0: none)."""
        if isinstance(context_facts, bool) or not isinstance(context_facts, int) or \
                context_facts < 0:
            raise ConfigError(f"keyword context of {context_facts!r} facts: pass an int >= 0")
        self._context_facts = context_facts
        self._users: dict[str, sqlite3.Connection] = {}
        self._groups: dict[str, dict[int, str | None]] = {}
        """Per user, each indexed fact id's group."""
        self._ids: dict[str, dict[str | None, list[int]]] = {}
        """Per user and group, the indexed fact ids, ascending (a context is the ids before);
        kept only with context_facts > 0."""

    def add(self, user_id: str, fact_ids: Sequence[int], texts: Sequence[str],
            groups: Sequence[str | None] | None = None) -> None:
        """Index texts, one per fact id, each in a group (None by default).

        An id already indexed gets the new text and group. The new facts get their contexts,
        and so do the context_facts facts after each in its group (an id added below others,
        or re-indexed, changes their contexts).
        """
        if not fact_ids:
            return
        new = dict(zip(fact_ids, texts, strict=True))
        group_of = dict(zip(fact_ids, groups or [None] * len(new), strict=True))
        self.remove(user_id, [f for f in new if f in self._groups.get(user_id, ())])
        db = self._users.get(user_id)
        if db is None:
            db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
            db.execute("CREATE VIRTUAL TABLE facts USING fts5(text, context, "
                       "tokenize='porter unicode61')")
            self._users[user_id], self._groups[user_id], self._ids[user_id] = db, {}, {}
        self._groups[user_id].update(group_of)
        by_group: dict[str | None, list[int]] = {}
        for fact_id in sorted(new) if self._context_facts else ():
            ids = self._ids[user_id].setdefault(group_of[fact_id], [])
            bisect.insort(ids, fact_id)  # new ids are the largest: appended
            by_group.setdefault(group_of[fact_id], []).append(fact_id)
        contexts: dict[int, str] = {}
        for group, added in by_group.items():
            contexts.update(self._contexts(user_id, group, added, new, inclusive=True))
        with db:
            db.executemany("INSERT INTO facts(rowid, text, context) VALUES (?, ?, ?)",
                           [(f, text, contexts.pop(f, "")) for f, text in new.items()])
            db.executemany("UPDATE facts SET context = ? WHERE rowid = ?",
                           [(context, f) for f, context in contexts.items()])

    def remove(self, user_id: str, fact_ids: Iterable[int]) -> None:
        """Unindex facts; ids not indexed are skipped. A user left with none is dropped.

        The facts after each removed one in its group get new contexts.
        """
        known = self._groups.get(user_id)
        if known is None:
            return
        by_group: dict[str | None, list[int]] = {}
        for fact_id in dict.fromkeys(fact_ids):
            if fact_id in known:
                group = known.pop(fact_id)
                if self._context_facts:  # the ordered ids exist only for contexts
                    ids = self._ids[user_id][group]
                    del ids[bisect.bisect_left(ids, fact_id)]
                by_group.setdefault(group, []).append(fact_id)
        if not by_group:
            return
        if not known:
            self.drop_user(user_id)
            return
        contexts: dict[int, str] = {}
        for group, gone in by_group.items():
            contexts.update(self._contexts(user_id, group, gone, {}, inclusive=False))
            if not self._ids[user_id].get(group, True):
                del self._ids[user_id][group]
        db = self._users[user_id]
        with db:
            db.executemany("DELETE FROM facts WHERE rowid = ?",
                           [(f,) for gone in by_group.values() for f in gone])
            db.executemany("UPDATE facts SET context = ? WHERE rowid = ?",
                           [(context, f) for f, context in contexts.items()])

    def _contexts(self, user_id: str, group: str | None, changed: list[int],
                  texts: dict[int, str], inclusive: bool) -> dict[int, str]:
        """New contexts, by id, of the facts that a change of these ids of the group touches.

        They are the context_facts facts after each (and each changed id itself, if inclusive:
        it is indexed). texts: fact texts not yet in the table (an add's); the others are read
        from it.
        """
        ids, before = self._ids[user_id].get(group, []), self._context_facts
        if not before or not ids:
            return {}
        positions: set[int] = set()
        for fact_id in changed:  # a removed id's position is its first follower's
            at = bisect.bisect_left(ids, fact_id)
            positions.update(range(at, min(len(ids), at + before + inclusive)))
        needed = sorted({ids[j] for i in positions for j in range(max(0, i - before), i)
                         if ids[j] not in texts})
        known = dict(texts)
        db = self._users[user_id]
        for start in range(0, len(needed), 500):  # SQLite's bound-parameter limit
            chunk = needed[start:start + 500]
            known.update(db.execute(
                f"SELECT rowid, text FROM facts WHERE rowid IN ({','.join('?' * len(chunk))})",
                chunk).fetchall())
        return {ids[i]: " ".join(known[ids[j]] for j in range(max(0, i - before), i))
                for i in sorted(positions)}

    def drop_user(self, user_id: str) -> None:
        """Forget a user's texts (no-op for an unknown user)."""
        db = self._users.pop(user_id, None)
        self._groups.pop(user_id, None)
        self._ids.pop(user_id, None)
        if db is not None:
            db.close()

    def count(self, user_id: str) -> int:
        """The user's indexed facts."""
        return len(self._groups.get(user_id, ()))

    def context(self, user_id: str, fact_id: int) -> str | None:
        """A fact's keyword context (None: not indexed)."""
        db = self._users.get(user_id)
        row = None if db is None else db.execute(
            "SELECT context FROM facts WHERE rowid = ?", (fact_id,)).fetchone()
        return None if row is None else str(row[0])

    def search(self, user_id: str, query: str, k: int) -> list[tuple[FactId, float]]:
        """The user's k best (fact id, BM25 > 0) for the query's words, best first.

        Equal scores rank by smaller fact id; [] when no fact has a word of the query.
        """
        db = self._users.get(user_id)
        terms = ['"' + t.replace('"', '""') + '"' for t in query_terms(query)]
        if db is None or not terms or k <= 0:
            return []
        scope = "" if CONTEXT_WEIGHT and self._context_facts else "text : "
        if len(terms) * self.count(user_id) > MAX_POSTINGS:
            terms = _rarest(db, terms, scope)
        if not terms:
            return []
        match = f"{scope}({' OR '.join(terms)})"
        rows = db.execute("SELECT rowid, -bm25(facts, 1.0, ?) AS score FROM facts "
                          "WHERE facts MATCH ? ORDER BY score DESC, rowid LIMIT ?",
                          (float(CONTEXT_WEIGHT), match, k)).fetchall()
        return [(FactId(f), float(s)) for f, s in rows]


def _rarest(db: sqlite3.Connection, terms: list[str], scope: str) -> list[str]:
    """The rarest of the quoted terms whose matches add up to at most MAX_POSTINGS."""
    count = ("SELECT count(*) FROM (SELECT 1 FROM facts WHERE facts MATCH ? LIMIT "
             f"{MAX_POSTINGS + 1})")
    kept, total = [], 0
    for matches, term in sorted((db.execute(count, (scope + t,)).fetchone()[0], t)
                                for t in terms):
        if total + matches > MAX_POSTINGS:
            break
        if matches:
            kept.append(term)
            total += matches
    return kept
