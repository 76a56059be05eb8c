"""SavePlan: the write path's kv_transfer_params (capture a save prompt's facts into the slab).

Like an InjectionPlan (plan.py) it is versioned, parsed strictly and authenticated with the
engine's MAC; from_params (plan.py) parses both kinds.
"""

from __future__ import annotations

import hmac
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from inferscale_engine.errors import PlanError
from inferscale_engine.protocol.wire import (
    PARAMS_KEY,
    PLAN_VERSION,
    int_field,
    ints_field,
    key_scales,
    mac_of,
    pack_token_ids,
    utf8,
)

_MAX_SAVE_SPANS = 4096  # most facts one save prompt may capture


@dataclass(frozen=True, slots=True)
class SaveSpan:
    """One fact of a save prompt: capture prompt[start:start + num_tokens] into `pages`."""

    slab_key: int
    start: int
    num_tokens: int
    pages: tuple[int, ...]

    @property
    def end(self) -> int:
        """One past the fact's last token."""
        return self.start + self.num_tokens


@dataclass(frozen=True, slots=True)
class SavePlan:
    """Write path: capture each span's prompt tokens (a fact) into slab pages under its key.

    A save prompt is [preamble][context][fact] or, for a run of facts that each follow the one
    before (Context-Window Encoding of a batch), [preamble][context][fact 1]...[fact n]: one
    forward pass, one span per fact; the last span ends the prompt. Bound to the one save
    prompt and the slab allocations it was issued for: the MAC covers the WHOLE prompt (a
    replay under another prefix does not verify), and a worker captures a span only if its
    `slab_key` is newer than the last capture into every one of its pages (slab keys are never
    reused, so a plan is single use and a stale plan cannot overwrite a page that was freed and
    handed to another fact).
    """

    user_id: str
    spans: tuple[SaveSpan, ...]
    mac: str = ""
    key_scale: tuple[float, ...] = ()
    """Factor the stored keys are scaled by (key temperature): () = 1, one value for every
    layer, or one per layer. One value for the whole run."""

    @classmethod
    def one(cls, user_id: str, slab_key: int, start: int, num_tokens: int,
            pages: Sequence[int], key_scale: tuple[float, ...] = ()) -> SavePlan:
        """A plan of one span (unsigned)."""
        return cls(user_id, (SaveSpan(slab_key, start, num_tokens, tuple(pages)),),
                   key_scale=key_scale)

    @property
    def end(self) -> int:
        """One past the last span's last token: the save prompt's length."""
        return self.spans[-1].end

    def problem(self) -> str:
        """Why the spans cannot describe one save prompt ('' if they can)."""
        if not self.spans:
            return "a save plan needs at least one span"
        position = 0
        for span in self.spans:
            if span.start < position or span.num_tokens <= 0 or not span.pages:
                return (f"save spans must be non-empty, hold pages, and follow each other "
                        f"without overlap; span at {span.start} of {span.num_tokens} tokens "
                        f"after position {position}")
            position = span.end
        if len({s.slab_key for s in self.spans}) != len(self.spans):
            return "save spans need distinct slab keys"
        return ""

    def _payload(self, prompt_token_ids: Sequence[int]) -> bytes:
        user = utf8(self.user_id)
        header = b"save|%d|%d:%b|%d|%b|" % (
            PLAN_VERSION, len(user), user, len(self.spans),
            utf8(",".join(map(repr, self.key_scale))))
        spans = b"".join(b"%d,%d,%d,%d:%b|" % (s.slab_key, s.start, s.num_tokens, len(s.pages),
                                               utf8(",".join(map(str, s.pages))))
                         for s in self.spans)
        return header + spans + pack_token_ids(prompt_token_ids)

    def signed(self, secret: bytes, prompt_token_ids: Sequence[int]) -> SavePlan:
        """Copy with the MAC set for this save prompt.

        Raises:
            PlanError: the spans are malformed, or the prompt does not end at `end`.
        """
        if problem := self.problem():
            raise PlanError(problem)
        if len(prompt_token_ids) != self.end:
            raise PlanError(f"save prompt has {len(prompt_token_ids)} tokens; the plan needs "
                            f"{self.end} (last fact at [{self.spans[-1].start}, {self.end}))")
        return replace(self, mac=mac_of(secret, self._payload(prompt_token_ids)))

    def verify(self, secret: bytes, prompt_token_ids: Sequence[int]) -> bool:
        """True if the MAC is valid for this content and exactly this prompt."""
        if self.problem() or len(prompt_token_ids) != self.end:
            return False
        try:
            payload = self._payload(prompt_token_ids)
        except (TypeError, struct.error):
            return False
        return hmac.compare_digest(utf8(self.mac), utf8(mac_of(secret, payload)))

    def to_params(self) -> dict[str, Any]:
        """kv_transfer_params of the save request."""
        return {PARAMS_KEY: {
            "v": PLAN_VERSION, "kind": "save", "user": self.user_id,
            "spans": [{"key": s.slab_key, "start": s.start, "num_tokens": s.num_tokens,
                       "pages": list(s.pages)} for s in self.spans],
            "key_scale": list(self.key_scale), "mac": self.mac,
        }}


def parse_save(raw: Mapping[str, Any], user: str, mac: str) -> SavePlan:
    """The save plan of a params entry whose version, kind, user and mac were read.

    Raises:
        PlanError: a malformed span, or spans that cannot describe one save prompt.
    """
    spans = raw.get("spans")
    if not isinstance(spans, list | tuple) or not spans or len(spans) > _MAX_SAVE_SPANS:
        raise PlanError(f"save plan field 'spans' must be a list of 1..{_MAX_SAVE_SPANS} "
                        f"spans, got {type(spans).__name__}")
    parsed = []
    for span in spans:
        if not isinstance(span, Mapping):
            raise PlanError("each save span must be a mapping with key, start, num_tokens "
                            "and pages")
        parsed.append(SaveSpan(int_field(span, "key"), int_field(span, "start"),
                               int_field(span, "num_tokens"), tuple(ints_field(span, "pages"))))
    save = SavePlan(user, tuple(parsed), mac, key_scales(raw.get("key_scale")))
    if problem := save.problem():
        raise PlanError(problem)
    return save
