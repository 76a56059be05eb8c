"""Transfers: the verbs that move a user's facts out of and into a Memory (export, import_).

A plain part Memory holds and forwards to (main.py), as it does Editing and Listing. export
writes InferScale's JSON Lines (exporting.py); import_ reads that, mem0's export or a LangGraph
store's dump (formats.py). An import is checked whole first (each record, then its token ids:
an error names the line and nothing is stored), then embedded, then stored in one transaction
(store/transfer.py: times, supersede links and history as the file has them), then registered
like an add's facts. A record whose identity the user already has is skipped, so a second
import of one file adds nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import torch
from tqdm import tqdm

from inferscale_engine.errors import FactNotFoundError, InferScaleError, InvalidRequestError
from inferscale_engine.memory import exporting, formats
from inferscale_engine.memory.formats import ImportRecord
from inferscale_engine.memory.gate import InteractiveGate
from inferscale_engine.memory.registration import RegisteredFacts
from inferscale_engine.memory.scope import Scopes
from inferscale_engine.memory.store import FactStore
from inferscale_engine.memory.store.transfer import ImportedFact, identity
from inferscale_engine.memory.types import ImportResult

logger = logging.getLogger(__name__)

_CHUNK = 256
"""Facts embedded per step of an import (the progress bar moves by them)."""


class Transfers:
    """Memory's export and import verbs."""

    def __init__(self, store: FactStore, served: RegisteredFacts, scopes: Scopes,
                 gate: InteractiveGate, counters: Counter[str],
                 tokenize: Callable[[str, float | None], tuple[int, ...]],
                 embed: Callable[[list[str]], torch.Tensor], encode: bool,
                 on_expiry: Callable[[], None], pin: Callable[..., Sequence[int]]) -> None:
        self._store, self._served, self._scopes, self._gate = store, served, scopes, gate
        self.counters, self._tokenize, self._embed, self._encode = counters, tokenize, embed, encode
        self._on_expiry = on_expiry
        """Starts the expiry sweeper (an imported fact may expire)."""
        self._pin = pin
        """Memory.pin: pins again the facts an export says were pinned."""

    def export(self, *, user_id: str) -> Iterator[str]:
        """Every stored fact of the user with its history, as JSON Lines (exporting.py).

        Current, superseded and expired facts alike; the lines end in newlines, so
        `file.writelines(memory.export(user_id="u"))` writes the file. Read now, under the
        Memory's lock; the lines are made as they are iterated.
        """
        with self._scopes.user(user_id, sync=False) as uid:
            facts = self._store.get_all(user_id=uid)
            events = self._store.user_history(user_id=uid)
        return exporting.lines(uid, facts, events)

    def import_(self, *, user_id: str, file: str | os.PathLike[str] | IO[str],
                format: str | None = None, progress_bar: bool | None = None) -> ImportResult:
        """Import a file of facts into the user's memory: our export, mem0's, LangGraph's.

        Facts keep their texts, metadata, agent and run scopes, times, expiry, supersede links
        (superseded facts stay superseded) and, from our export, their history and pins
        (within the pin caps: a fact over them is imported unpinned, counted); they are
        embedded with this Memory's embedder and their KV encoded as an add's. Records the user
        already has (same source: imported before, or the user's own facts exported) are
        skipped. No duplicate check or supersession against the user's other facts.

        Args:
            file: a path, or an open text file (io.StringIO for content at hand).
            format: 'inferscale', 'mem0' or 'langgraph'; None: told from the content.
            progress_bar: show one while facts are embedded (None: for 256 facts or more, on
                a terminal).

        Raises:
            InvalidRequestError: the file or one of its records is bad (the message names the
                line) or a text is over max_fact_tokens; nothing is imported.
        """
        user = self._scopes.user(user_id)
        found, records = formats.read(_text_of(file), format)
        with user as uid:
            known = {identity(f) for f in self._store.get_all(user_id=uid)}
        todo = [r for r in records if r.source not in known]
        facts = self._prepared(todo, progress_bar)
        with user as uid:
            ids = self._store.import_facts(user_id=uid, facts=facts)
            stored = self._store.get(user_id=uid, fact_ids=ids)
            self._served.stage(ids)
            self._served.wrote(self._store, uid)
            self.counters["imported"] += len(ids)
        self._served.register_in_chunks(uid, stored, self._encode, self._gate,
                                        self._scopes.open)
        if any(f.expires_at is not None for f in stored):
            self._on_expiry()
        self._pin_again(uid, [i for i, r in zip(ids, todo, strict=True) if r.pinned])
        return ImportResult(found, len(records), tuple(ids), len(records) - len(ids))

    def _pin_again(self, user_id: str, fact_ids: Sequence[int]) -> None:
        """Pin the imported facts the file says were pinned, each within the pin caps.

        A fact over them, or no longer current, is imported unpinned (logged and counted).
        """
        for fact_id in fact_ids:
            try:
                self._pin(user_id=user_id, fact_ids=[fact_id])
            except (InvalidRequestError, FactNotFoundError) as exc:
                logger.warning("imported fact %s of %r stays unpinned: %s", fact_id, user_id,
                               exc)
                self.counters["import_unpinned"] += 1

    def _prepared(self, records: list[ImportRecord], progress_bar: bool | None
                  ) -> list[ImportedFact]:
        """The records tokenized (a text too long is an error naming its line) and embedded."""
        token_ids = []
        for record in records:
            try:
                token_ids.append(self._tokenize(record.text, record.created_at if (
                    record.valid_from is None) else record.valid_from))
            except InferScaleError as exc:
                raise InvalidRequestError(f"{record.where}: {exc}; nothing was "
                                          "imported") from None
        vectors: list[torch.Tensor] = []
        show = len(records) >= _CHUNK if progress_bar is None else progress_bar
        with tqdm(total=len(records), unit="fact", desc="InferScale: importing facts",
                  disable=None if show else True) as bar:
            for lo in range(0, len(records), _CHUNK):
                chunk = records[lo:lo + _CHUNK]
                vectors.extend(self._embed([r.text for r in chunk]).cpu())
                bar.update(len(chunk))
        now = time.time()
        return [_imported(r, tokens, vector, now)
                for r, tokens, vector in zip(records, token_ids, vectors, strict=True)]


def _imported(record: ImportRecord, token_ids: tuple[int, ...], vector: torch.Tensor,
              now: float) -> ImportedFact:
    created = now if record.created_at is None else record.created_at
    history = record.history
    if history is None:  # the file kept none: the fact was added when it was created
        history = (("ADD", None, record.text, created),) + (
            (("SUPERSEDE", record.text, None, record.valid_to),)
            if record.valid_to is not None else ())
    return ImportedFact(record.source, record.text, token_ids, vector, record.metadata,
                        created, created if record.updated_at is None else record.updated_at,
                        record.session_id, record.valid_from, record.valid_to,
                        record.superseded_by, record.expires_at, history)


def _text_of(file: str | os.PathLike[str] | IO[str]) -> str:
    if isinstance(file, str | os.PathLike):
        try:
            return Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeError) as exc:
            raise InvalidRequestError(f"cannot read {os.fspath(file)!r} ({exc}); give a UTF-8 "
                                      "JSON or JSON Lines file") from None
    text = file.read()
    if not isinstance(text, str):
        raise InvalidRequestError(f"file is a {type(file).__name__} that reads "
                                  f"{type(text).__name__}; open it in text mode")
    return text
