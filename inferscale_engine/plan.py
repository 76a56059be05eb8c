"""InjectionPlan and SavePlan: the kv_transfer_params format, spelled in this module only.

A plan crosses process boundaries (app -> vLLM EngineCore -> workers) and may arrive from an
untrusted client through vLLM's OpenAI server, so it is versioned, parsed strictly and
authenticated with a MAC (keyed BLAKE2b) under a per-engine secret that only the engine and its
connector know. The scheduler-side connector re-checks the prompt's token ids against the plan.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from itertools import accumulate, repeat
from operator import rshift
from pathlib import Path
from typing import Any

from inferscale_engine.errors import PlanError
from inferscale_engine.native import compiled
from inferscale_engine.wire import int_field, ints_field, key_scales, packed_field, str_field

PLAN_VERSION = 6
"""6: MACs and salts are keyed BLAKE2b; 5: save plans hold spans (runs of facts); 4: keys and
lengths packed (3: int lists)."""
PARAMS_KEY = "inferscale"
SYSTEM_OWNER = ""
"""Owner of shared entries (the preamble): readable by every user, writable by the engine only."""

_MAX_SAVE_SPANS = 4096  # most facts one save prompt may capture


def token_digest(token_ids: Sequence[int]) -> str:
    """Stable 16-hex-digit digest of a token id sequence."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=8).hexdigest()


def cache_salt(secret: bytes, user_id: str, slab_keys: Sequence[int]) -> str:
    """The cache_salt of an injected prompt: a MAC of its user and slab entries.

    Keyed by the engine's secret, so nobody who knows only a user id and slab keys can compute
    it and address that user's blocks in vLLM's prefix cache.
    """
    return _salt(secret, user_id, _pack_keys(slab_keys))


def _salt(secret: bytes, user_id: str, packed_keys: bytes) -> str:  # keys packed once
    user = _utf8(user_id)
    return _mac(secret, b"salt|%d|%d:%b|%b" % (PLAN_VERSION, len(user), user, packed_keys))


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of prompt tokens (a fact or the preamble): slab entry, first position, ids."""

    slab_key: int
    start: int
    token_ids: tuple[int, ...]

    @property
    def end(self) -> int:
        """One past the serving position of the last token."""
        return self.start + len(self.token_ids)


@dataclass(frozen=True, slots=True)
class InjectionPlan:
    """Read path: runs of stored KV that tile prompt[0:num_tokens), and their token ids.

    Slab keys, run lengths and token ids travel packed (little-endian int64 / int32 / int32,
    base64 in the params), so that copying, parsing, hashing and comparing a plan of thousands
    of tokens costs a few C-level passes, not Python loops: vLLM deep-copies and walks
    sampling params, and the scheduler checks every plan.
    """

    user_id: str
    slab_keys: tuple[int, ...]
    lengths: tuple[int, ...]
    tokens: bytes
    """All runs' token ids, concatenated, as little-endian int32."""
    cache_salt: str
    mac: str = ""
    wire: tuple[bytes, bytes] | tuple[()] = field(default=(), compare=False, repr=False)
    """slab_keys and lengths packed as in the params (hashed and sent as they are), set only
    by from_params / from_runs; () packs them when needed."""

    @classmethod
    def from_runs(cls, user_id: str, slab_keys: Sequence[int], runs: Sequence[bytes],
                  cache_salt: str | None = None, secret: bytes = b"") -> InjectionPlan:
        """Build from each run's token ids, packed (pack_token_ids), in prompt order (unsigned).

        Facts keep their ids packed (FactRecord.packed_ids), so a plan is a join, not a loop;
        where plan_pack.c is built, keys, lengths and the join are one C call.
        cache_salt None: the salt of (user_id, slab_keys) under `secret`.

        Raises:
            PlanError: no runs, an empty or ragged run, or not one slab key per run.
        """
        pack = plan_packer()
        if pack is not None:  # it refuses runs that are not a list
            try:
                keys, packed_keys, lengths, packed_lengths, tokens = pack(slab_keys, runs)
            except (ValueError, TypeError, OverflowError):
                pass  # the Python path below says what is wrong
            else:
                salt = _salt(secret, user_id, packed_keys) if cache_salt is None else cache_salt
                return cls(user_id, keys, lengths, tokens, salt, "", (packed_keys, packed_lengths))
        lengths = tuple(map(rshift, map(len, runs), repeat(2, len(runs))))  # ids: bytes / 4
        tokens = b"".join(runs)
        # A run of 1-3 bytes counts 0 ids; a ragged one makes the lengths sum short.
        if (len(slab_keys) != len(runs) or not runs or not min(lengths)
                or sum(lengths) * 4 != len(tokens)):
            raise PlanError(f"a plan needs one slab key per non-empty run of packed int32 ids; "
                            f"got {len(slab_keys)} keys for runs of {lengths!r:.80} ids")
        packed_keys = _pack_keys(slab_keys)
        salt = _salt(secret, user_id, packed_keys) if cache_salt is None else cache_salt
        return cls(user_id, tuple(slab_keys), lengths, tokens, salt, "",
                   (packed_keys, _pack_lengths(lengths)))

    @classmethod
    def from_segments(cls, user_id: str, segments: Sequence[Segment], cache_salt: str
                      ) -> InjectionPlan:
        """Build from segments that tile the prompt from position 0 (unsigned).

        Raises:
            PlanError: the segments do not tile the prompt, or an id is out of int32.
        """
        _check_tiling(tuple(segments))
        try:
            runs = [pack_token_ids(s.token_ids) for s in segments]
        except (struct.error, TypeError) as exc:
            raise PlanError(f"token ids must be ints in [-2**31, 2**31): {exc}") from None
        return cls.from_runs(user_id, [s.slab_key for s in segments], runs, cache_salt)

    @property
    def num_tokens(self) -> int:
        """Number of prompt tokens the plan covers (all of them at the start of the prompt)."""
        return len(self.tokens) // 4

    @property
    def starts(self) -> list[int]:
        """Serving position of each run's first token."""
        return list(accumulate(self.lengths[:-1], initial=0))

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The runs as Segments (app side and tests; the hot path never builds them)."""
        ids = struct.unpack(f"<{self.num_tokens}i", self.tokens)
        return tuple(Segment(k, s, ids[s:s + n])
                     for k, s, n in zip(self.slab_keys, self.starts, self.lengths))

    def matches(self, prompt_token_ids: Sequence[int]) -> bool:
        """True if the prompt starts with exactly the plan's tokens."""
        n = self.num_tokens
        if len(prompt_token_ids) < n:
            return False
        try:
            return pack_token_ids(prompt_token_ids[:n]) == self.tokens
        except (struct.error, TypeError):
            return False

    def _payload(self, tokens: bytes | None = None) -> bytes:
        # Strings are length-prefixed so that no two (user, salt) pairs share a payload.
        user, salt = _utf8(self.user_id), _utf8(self.cache_salt)
        header = b"inject|%d|%d:%b|%d:%b|%d|" % (PLAN_VERSION, len(user), user, len(salt), salt,
                                                 len(self.lengths))
        keys, lengths = self.packed_keys_lengths()
        return header + keys + lengths + (self.tokens if tokens is None else tokens)

    def packed_keys_lengths(self) -> tuple[bytes, bytes]:
        """Slab keys (int64) and run lengths (int32), little-endian: `wire`, or packed now."""
        return self.wire or (_pack_keys(self.slab_keys), _pack_lengths(self.lengths))

    def bound_to(self, secret: bytes, prompt_token_ids: Sequence[int]) -> InjectionPlan | None:
        """The plan with the prompt's first tokens as its own, if the MAC verifies for them.

        Authenticity and prompt match in one pass: the MAC over the prompt's leading
        sum(lengths) ids in place of the plan's, so a plan parsed without its tokens
        (from_params(..., tokens=False)) needs no decoding. None if it does not verify
        (forged, or another prompt): `verify` and `matches` tell which.
        """
        n = sum(self.lengths)
        if len(prompt_token_ids) < n:
            return None
        try:
            tokens = pack_token_ids(prompt_token_ids[:n])
            payload = self._payload(tokens)
        except (struct.error, TypeError):
            return None
        if not hmac.compare_digest(_utf8(self.mac), _utf8(_mac(secret, payload))):
            return None
        return InjectionPlan(self.user_id, self.slab_keys, self.lengths, tokens, self.cache_salt,
                             self.mac, self.wire)  # not dataclasses.replace: a hot path

    def signed(self, secret: bytes) -> InjectionPlan:
        """Copy with the MAC set."""
        return InjectionPlan(self.user_id, self.slab_keys, self.lengths, self.tokens,
                             self.cache_salt, _mac(secret, self._payload()), self.wire)

    def verify(self, secret: bytes) -> bool:
        """True if the MAC is valid for this content."""
        try:
            payload = self._payload()
        except struct.error:  # a key out of int64 (only a forged plan has one)
            return False
        return hmac.compare_digest(_utf8(self.mac), _utf8(_mac(secret, payload)))

    def to_params(self) -> dict[str, Any]:
        """kv_transfer_params for SamplingParams(extra_args=...) or the OpenAI server."""
        keys, lengths = self.packed_keys_lengths()
        return {PARAMS_KEY: {
            "v": PLAN_VERSION, "kind": "inject", "user": self.user_id, "salt": self.cache_salt,
            "keys": _b64(keys), "lengths": _b64(lengths), "tokens": _b64(self.tokens),
            "mac": self.mac,
        }}


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as little-endian int32 bytes (one C-level pass; struct beats array here).

    Raises:
        struct.error: an id is out of int32 or not an int.
    """
    return struct.pack(f"<{len(token_ids)}i", *token_ids)


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
        user = _utf8(self.user_id)
        header = b"save|%d|%d:%b|%d|%b|" % (
            PLAN_VERSION, len(user), user, len(self.spans),
            _utf8(",".join(map(repr, self.key_scale))))
        spans = b"".join(b"%d,%d,%d,%d:%b|" % (s.slab_key, s.start, s.num_tokens, len(s.pages),
                                               _utf8(",".join(map(str, s.pages))))
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
        return replace(self, mac=_mac(secret, self._payload(prompt_token_ids)))

    def verify(self, secret: bytes, prompt_token_ids: Sequence[int]) -> bool:
        """True if the MAC is valid for this content and exactly this prompt."""
        if self.problem() or len(prompt_token_ids) != self.end:
            return False
        try:
            payload = self._payload(prompt_token_ids)
        except (TypeError, struct.error):
            return False
        return hmac.compare_digest(_utf8(self.mac), _utf8(_mac(secret, payload)))

    def to_params(self) -> dict[str, Any]:
        """kv_transfer_params of the save request."""
        return {PARAMS_KEY: {
            "v": PLAN_VERSION, "kind": "save", "user": self.user_id,
            "spans": [{"key": s.slab_key, "start": s.start, "num_tokens": s.num_tokens,
                       "pages": list(s.pages)} for s in self.spans],
            "key_scale": list(self.key_scale), "mac": self.mac,
        }}


Plan = InjectionPlan | SavePlan


def from_params(params: Mapping[str, Any] | None, tokens: bool = True) -> Plan | None:
    """Parse kv_transfer_params. None if they carry no InferScale plan.

    Args:
        tokens: decode an inject plan's token ids; with False they are left empty (b"") after
            checking the field's size, for `InjectionPlan.bound_to`.

    Raises:
        PlanError: the InferScale entry is malformed or of another version. The MAC is not
            checked here (see `verify`).
    """
    if not params or PARAMS_KEY not in params:
        return None
    raw = params[PARAMS_KEY]
    if not isinstance(raw, Mapping):
        raise PlanError(f"kv_transfer_params[{PARAMS_KEY!r}] must be a mapping, got "
                        f"{type(raw).__name__}; build plans with Engine, not by hand")
    if raw.get("v") != PLAN_VERSION:
        raise PlanError(f"plan version {raw.get('v')!r} is not supported (this build speaks "
                        f"{PLAN_VERSION}); app and engine must run the same InferScale release")
    kind = raw.get("kind")
    if kind == "local":  # inferscale_engine.handoff: only its engine's scheduler resolves it
        raise PlanError("an in-process plan reference ('local') cannot be parsed; only the "
                        "scheduler of the engine process that made it resolves it")
    user = str_field(raw, "user")
    mac = str_field(raw, "mac")
    if kind == "inject":
        keys_bytes = packed_field(raw, "keys", 8, "int64 slab keys")
        lengths_bytes = packed_field(raw, "lengths", 4, "int32 run lengths")
        keys = struct.unpack(f"<{len(keys_bytes) >> 3}q", keys_bytes)
        lengths = struct.unpack(f"<{len(lengths_bytes) >> 2}i", lengths_bytes)
        if tokens:
            packed = packed_field(raw, "tokens", 4, "int32 token ids")
            size = len(packed)
        else:  # the size of base64 without decoding it (the MAC then binds the prompt's ids)
            encoded = str_field(raw, "tokens")
            packed, size = b"", 3 * (len(encoded) // 4) - encoded[-2:].count("=")
        if len(keys) != len(lengths) or not keys:
            raise PlanError(f"inject plan needs as many 'keys' as 'lengths', at least one; got "
                            f"{len(keys)} and {len(lengths)}")
        if min(keys) < 0 or min(lengths) <= 0:
            raise PlanError("inject plan needs non-negative 'keys' and positive 'lengths'")
        if sum(lengths) * 4 != size:
            raise PlanError(f"inject plan lengths sum to {sum(lengths)} but 'tokens' holds "
                            f"{size // 4} token ids")
        return InjectionPlan(user, keys, lengths, packed, str_field(raw, "salt"), mac,
                             (keys_bytes, lengths_bytes))
    if kind == "save":
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
    raise PlanError(f"plan kind {kind!r} is unknown; expected 'inject' or 'save'")


@cache
def plan_packer() -> Any:
    """plan_pack.c's pack (native.py), or None: from_runs' Python path."""
    module = compiled(Path(__file__).with_name("plan_pack.c"), "inferscale_plan_pack")
    return None if module is None else module.pack


def _pack_keys(slab_keys: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(slab_keys)}q", *slab_keys)


def _pack_lengths(lengths: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(lengths)}i", *lengths)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _utf8(text: str) -> bytes:  # surrogatepass: a forged plan's lone surrogates fail the MAC
    return text.encode("utf-8", "surrogatepass")


def _mac(secret: bytes, payload: bytes) -> str:
    # Keyed BLAKE2b (RFC 7693's MAC mode), 128-bit tags: one C call. HMAC-SHA256 cost 57-77 us
    # per call with cold caches on 2 EPYC cores, keyed BLAKE2b 16-40 (plans of 1-12 KB); a
    # request pays one (MP=0: the salt) or three (signed: salt, MAC, the scheduler's check).
    if len(secret) > 64:  # BLAKE2b takes keys of up to 64 bytes
        secret = hashlib.blake2b(secret).digest()
    return hashlib.blake2b(payload, key=secret, digest_size=16).hexdigest()


def _check_tiling(segments: tuple[Segment, ...]) -> None:
    position = 0
    for seg in segments:
        if seg.start != position or not seg.token_ids:
            raise PlanError(f"segments must be non-empty and tile the prompt from position 0; "
                            f"segment at {seg.start} expected at {position}")
        position = seg.end


