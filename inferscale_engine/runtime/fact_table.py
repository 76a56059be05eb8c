"""FactTable: the facts the engine knows, by id, and what a new one must be to get in.

The write path's intake, before any KV moves (write_path.py): a fact's token ids checked
against max_fact_tokens, its context's tokens (Context-Window Encoding), its key scale, and its
id. Fact ids have one author at a time: the engine numbers the facts of add_facts itself,
unless a Memory claims the numbering (its store's ids; claim()), and then numbers none.
Called under the Engine's lock where it changes the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from inferscale_engine.checks import check_text, check_user_id
from inferscale_engine.config import EngineConfig
from inferscale_engine.errors import ConfigError, InvalidFactError, InvalidRequestError
from inferscale_engine.facts import Fact, FactId
from inferscale_engine.model.calibration import key_scale_tuple
from inferscale_engine.prompting.contexts import Context, context_texts, context_tokens
from inferscale_engine.prompting.prompt import PromptBuilder
from inferscale_engine.runtime.residency import FactRecord


class FactTable:
    """Fact id -> FactRecord of every registered fact; the rules of getting in."""

    def __init__(self, config: EngineConfig, prompts: PromptBuilder,
                 key_scale: tuple[float, ...], num_layers: int) -> None:
        self._config, self._prompts = config, prompts
        self._key_scale, self._num_layers = key_scale, num_layers
        self.records: dict[FactId, FactRecord] = {}
        self._next_id = 1
        self._owner: object | None = None
        """Who numbers the facts: None, the engine (add_facts); else a Memory (claim)."""

    def claim(self, owner: object) -> None:
        """Hand the numbering of facts to `owner` (a Memory: its store's ids) until released.

        Raises:
            ConfigError: another owner holds the numbering.
        """
        if self._owner not in (None, owner):
            raise ConfigError("another open Memory owns this Engine's fact ids (they are its "
                              "store's ids); build one Engine per Memory, or close the other "
                              "Memory first")
        self._owner = owner

    def release(self, owner: object) -> None:
        """End `owner`'s claim; the engine numbers add_facts' facts again."""
        if self._owner is owner:
            self._owner = None

    def new_ids(self, fact_ids: Sequence[FactId] | None, count: int) -> list[FactId]:
        """`fact_ids` checked, or (None) the next `count` ids the engine gives.

        Raises:
            InvalidRequestError: the engine is to number facts while a Memory owns the ids.
            InvalidFactError: not one distinct id per fact.
        """
        if fact_ids is None:
            if self._owner is not None:
                raise InvalidRequestError("a Memory owns this Engine's fact ids (its store "
                                          "numbers them); add the facts with Memory.add, or "
                                          "pass fact_ids= that the Memory's store cannot reach")
            return [FactId(self._next_id + i) for i in range(count)]
        ids = [FactId(int(f)) for f in fact_ids]
        if len(ids) != count or len(set(ids)) != count:
            raise InvalidFactError("fact_ids must hold one distinct id per text")
        return ids

    def tokenize(self, text: str, check_length: bool = True) -> tuple[int, ...]:
        """A fact's token ids as they appear in prompts (InvalidFactError: blank, too long)."""
        text = check_text(text, "a fact")
        ids = self._prompts.fact_ids(text)
        if check_length:
            self.check_length(ids, text)
        return ids

    def check_texts(self, texts: object) -> list[str]:
        """add_facts' texts, checked (InvalidFactError: not a list of visible strings)."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise InvalidFactError(f"texts must be a list of strings, got {type(texts).__name__}")
        return [check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]

    def split(self, text: str, tokenizer: Any) -> list[str]:
        """`text` cut into pieces that each fit in one fact (max_fact_tokens), in order."""
        limit, prompts = self._config.max_fact_tokens, self._prompts
        if len(prompts.fact_ids(text)) <= limit:
            return [text]
        token_ids = prompts.encode(text)
        # Room for the fact format, and for a cut piece tokenizing a little longer on its own.
        step = max(1, limit - len(prompts.fact_ids("")) - 8)
        return [tokenizer.decode(token_ids[i:i + step]) for i in range(0, len(token_ids), step)]

    def check_length(self, token_ids: Sequence[int], text: str) -> None:
        """InvalidFactError if a fact is over max_fact_tokens."""
        if len(token_ids) > self._config.max_fact_tokens:
            raise InvalidFactError(f"a fact has {len(token_ids)} tokens, over max_fact_tokens="
                                   f"{self._config.max_fact_tokens}; split it (Memory splits "
                                   f"turns) or raise EngineConfig.max_fact_tokens: "
                                   f"{text[:60]!r}...")

    def build(self, facts: Sequence[Fact], contexts: Sequence[Context] | None,
              window: int | None, key_scale: float | tuple[float, ...] | None
              ) -> list[FactRecord]:
        """The records of one user's facts (not yet registered), their contexts tokenized.

        Raises:
            InvalidFactError: facts of several users, contexts of another length, a window
                beyond the configured one, a fact without token ids or too long.
        """
        users = {check_user_id(f.user_id) for f in facts}
        if len(users) > 1:
            raise InvalidFactError(f"facts of {len(users)} users in one call; add each user's "
                                   "facts separately")
        contexts = list(contexts) if contexts is not None else [None] * len(facts)
        if len(contexts) != len(facts):
            raise InvalidFactError(f"{len(contexts)} contexts for {len(facts)} facts; pass one "
                                   "context (or None) per fact")
        window = self._window(window)
        for fact in facts:
            if not fact.token_ids:
                raise InvalidFactError(f"fact {fact.fact_id} has no token ids")
            self.check_length(fact.token_ids, fact.text)
        scale = self._key_scale if key_scale is None else key_scale_tuple(key_scale,
                                                                      self._num_layers)
        known = {f.text: tuple(f.token_ids) for f in facts}  # a run's facts, tokenized once
        (user_id,) = users or {""}  # one user, its id normalized
        return [FactRecord(Fact(f.fact_id, user_id, f.text, tuple(f.token_ids)), ids,
                           key_scale=scale) for f, ids in zip(
                               facts, self._context_tokens(contexts, window, known), strict=True)]

    def admit(self, records: Sequence[FactRecord]) -> None:
        """Check that no record's id is registered; the engine's own numbering goes past them.

        Raises:
            InvalidFactError: an id is registered already (by add_facts or a Memory).
        """
        if clash := [r.fact.fact_id for r in records if r.fact.fact_id in self.records]:
            raise InvalidFactError(f"fact ids {clash[:5]} are already registered on this "
                                   "Engine; its ids have one author (a Memory's store, or "
                                   "add_facts): see Engine.claim_fact_ids")
        self._next_id = max([self._next_id - 1, *(r.fact.fact_id for r in records)]) + 1

    def _window(self, window: int | None) -> int:
        window = self._config.context_window_tokens if window is None else window
        if not 0 <= window <= self._config.context_window_tokens:
            raise InvalidFactError(f"window must be in [0, {self._config.context_window_tokens}"
                                   "] (EngineConfig.context_window_tokens)")
        return window

    def _context_tokens(self, contexts: Sequence[Context], window: int,
                        known: Mapping[str, tuple[int, ...]]) -> list[tuple[int, ...]]:
        prompts = self._prompts
        encode = prompts.batch_encoder(context_texts(contexts))  # one batch: a restart
        return [context_tokens(c, window, encode, lambda text: known.get(text) or  # registers
                               prompts.fact_ids(text),  # every stored fact's context
                               limit=window + self._config.context_run_tokens) for c in contexts]
