"""Older versions of a fact, left out of a read that asks about the present.

A plain add keeps every version of what changed ("I live in Denver.", later "My new apartment
is in Lisbon."), and a question about now retrieves both; a small model then names the older
value about half the time, whatever order the facts are in (docs/benchmarks.md, "Facts that
change"). Among the facts a search found, a fact is an older version of another when the other
became true later, the two are similar (cosine >= VERSION_SIMILARITY) and the other is about as
relevant to the query (its cosine with the query at most VERSION_RELEVANCE_GAP lower). Those
older versions are left out of the result.

Similarity alone cannot tell versions from related facts in conversations (two turns about the
same trip are as close as two cities someone lived in), so the rule applies only where the
question asks about the present ('now', 'currently', 'these days', ...: asks_about_now), unless
the Memory's hide_older_versions is 'always' (facts that are slots of a profile). Superseded
facts (supersede(), infer=True) are out of present reads anyway; this covers the plain adds.
Both constants were chosen on the knowledge-update dev set and checked on the LoCoMo dev fold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from inferscale_engine.errors import ConfigError, InvalidRequestError
from inferscale_engine.facts import FactId

HIDE_OLDER_VERSIONS = ("now", "always", "never")
"""'now': in reads whose query asks about the present; 'always': in every present read;
'never': every found fact is returned."""
DEFAULT_HIDE_OLDER_VERSIONS = "now"
VERSION_SIMILARITY = 0.3
"""Cosine between two found facts from which the older may be a version of the newer."""
VERSION_RELEVANCE_GAP = 0.15
"""How much less relevant to the query the newer fact may be and still count as its version."""
MAX_HITS = 200
"""Found facts compared with each other per read (the best first): a bound on the k x k
product of a read with a large k; versions ranked below are kept."""

_PRESENT = re.compile(
    r"\b(now|right now|currently|current|these days|nowadays|at the moment|at present|"
    r"presently|still|anymore|any more|latest|most recent|most recently|today)\b",
    re.IGNORECASE)


def check_hide_older_versions(value: object, *, setting: bool = False) -> str:
    """The value, if one of HIDE_OLDER_VERSIONS."""
    if value not in HIDE_OLDER_VERSIONS:
        error = ConfigError if setting else InvalidRequestError
        raise error(f"hide_older_versions={value!r} must be one of "
                    f"{', '.join(HIDE_OLDER_VERSIONS)}")
    return str(value)


def asks_about_now(query: str) -> bool:
    """Whether the query's question asks about the present ('Which city do I live in now?').

    The question is the query's last sentence ending in '?' (else its last line): a prompt a
    framework renders around the user's words ("Current conversation: ... Human: ...?") is
    judged by the user's question, not by the template.
    """
    return _PRESENT.search(_last_question(query)) is not None


def _last_question(query: str) -> str:
    """The last sentence of `query` that ends in '?', else its last non-blank line."""
    end = query.rfind("?")
    if end < 0:
        lines = [line for line in query.splitlines() if line.strip()]
        return lines[-1] if lines else ""
    start = max(query.rfind(mark, 0, end) for mark in (".", "!", "?", "\n")) + 1
    return query[start:end + 1]


def applies(policy: str, query: str) -> bool:
    """Whether a present read of `query` leaves older versions out under `policy`."""
    return policy == "always" or (policy == "now" and asks_about_now(query))


def older_versions(hits: Sequence[tuple[FactId, float]], similarity: Sequence[Sequence[float]],
                   since: Callable[[FactId], float | None],
                   texts: Sequence[str] | None = None) -> set[FactId]:
    """The hits that are older versions of another hit (module docstring).

    Args:
        hits: (fact id, cosine with the query) of the found facts.
        similarity: their pairwise cosines, [len(hits)][len(hits)].
        since: when a fact became true (None: unknown, never counted as newer or older).
        texts: the hits' texts; a question ('...?', a turn a chat stored) asserts nothing, so
            it is never the newer version of a fact.
    """
    times = [since(f) for f, _ in hits]
    if texts is not None:  # a question is compared as the older side only
        times_newer = [None if t.rstrip().endswith("?") else times[i]
                       for i, t in enumerate(texts)]
    else:
        times_newer = times
    out: set[FactId] = set()
    for i, (fact, score) in enumerate(hits):
        ti = times[i]
        if ti is None:
            continue
        for j, (other, other_score) in enumerate(hits):
            tj = times_newer[j]
            if j == i or tj is None or (tj, other) <= (ti, fact):  # not newer
                continue
            if similarity[i][j] >= VERSION_SIMILARITY and \
                    other_score >= score - VERSION_RELEVANCE_GAP:
                out.add(fact)
                break
    return out
