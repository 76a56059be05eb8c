"""InjectionPlan, and from_params for both kinds of plan (SavePlan: save_plan.py).

The kv_transfer_params format is spelled here, in save_plan.py and in wire.py (its primitives).
A plan crosses process boundaries (app -> vLLM EngineCore -> workers) and may arrive from an
untrusted client through vLLM's OpenAI server, so it is versioned, parsed strictly (unknown
fields refused) and authenticated with a MAC (keyed BLAKE2b) under a per-engine secret that only
the engine and its connector know.

What an inject plan's MAC covers: the format version, the user id, the cache_salt, the slab
keys, the run lengths and the prompt's first sum(lengths) token ids. The ids do not travel in
the plan: the scheduler computes the MAC over the prompt it was sent with, so a plan verifies
only for the prompt it was made for.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, repeat
from operator import rshift
from typing import Any

from inferscale_engine.errors import PlanError
from inferscale_engine.protocol.save_plan import SavePlan, SaveSpan, parse_save
from inferscale_engine.protocol.wire import (
    PARAMS_KEY,
    PLAN_VERSION,
    b64,
    mac_of,
    pack_token_ids,
    packed_field,
    str_field,
    utf8,
)

__all__ = ["PARAMS_KEY", "PLAN_VERSION", "SYSTEM_OWNER", "InjectionPlan", "Plan", "SavePlan",
           "SaveSpan", "Segment", "cache_salt", "client_salted", "from_params", "pack_token_ids",
           "save_salt", "tenant_salt", "text_salt", "token_digest"]

SYSTEM_OWNER = ""
"""Owner of shared entries (the preamble): readable by every user, writable by the engine only."""


def token_digest(token_ids: Sequence[int]) -> str:
    """Stable 16-hex-digit digest of a token id sequence."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=8).hexdigest()


def cache_salt(secret: bytes, user_id: str, slab_keys: Sequence[int]) -> str:
    """The cache_salt of an injected prompt: a MAC of its user and slab entries.

    Keyed by the engine's secret, so nobody who knows only a user id and slab keys can compute
    it and address that user's blocks in vLLM's prefix cache.
    """
    return _salt(secret, user_id, _pack_keys(slab_keys))


def save_salt(secret: bytes, user_id: str) -> str:
    """The cache_salt of a user's save requests (a MAC of the user under the engine's secret).

    A save prompt [preamble][context][fact] is a plain prefill of the user's text: unsalted,
    its blocks would stay in vLLM's shared prefix cache, and anyone could learn whether a guess
    of a fact is stored by sending it and reading cached_tokens (or the prefill time). Under
    this salt only the same user's saves share blocks (a run's context, the preamble).
    """
    user = utf8(user_id)
    return mac_of(secret, b"save-salt|%d|%d:%b" % (PLAN_VERSION, len(user), user))


def text_salt(secret: bytes, user_id: str, client_salt: str = "") -> str:
    """The cache_salt of a user's prompts that carry the user's data as plain text.

    Text mode, a fallback to text, the served model's infer=True prompts: unsalted, their
    blocks would stay in vLLM's shared prefix cache, and anyone could learn whether a guess of
    the user's text is in it by sending the same prompt and reading cached_tokens. Under this
    salt only the same user's text prompts (with the same client salt) share blocks.
    """
    return _keyed(secret, b"text-salt", user_id, client_salt)


def tenant_salt(secret: bytes, tenant: str, client_salt: str = "") -> str:
    """The cache_salt of a server's requests without memory, per API-key tenant.

    A tenant's own prompts share blocks with each other (a common system prompt is prefilled
    once per tenant), never with another tenant's or any user's memory prompts.
    """
    return _keyed(secret, b"tenant-salt", tenant, client_salt)


def client_salted(secret: bytes, salt: str, client_salt: str) -> str:
    """`salt` combined with a client's own cache_salt (unchanged without one).

    A client keeps what vLLM gives it (its prompts apart from its other prompts under another
    salt), inside the partition the server chose: it can never name another's salt.
    """
    return _keyed(secret, b"client-salt", salt, client_salt) if client_salt else salt


def _keyed(secret: bytes, kind: bytes, owner: str, client_salt: str) -> str:
    owner_bytes, client = utf8(owner), utf8(client_salt)
    return mac_of(secret, b"%b|%d|%d:%b|%d:%b" % (kind, PLAN_VERSION, len(owner_bytes),
                                                   owner_bytes, len(client), client))


def _salt(secret: bytes, user_id: str, packed_keys: bytes) -> str:  # keys packed once
    user = utf8(user_id)
    return mac_of(secret, b"salt|%d|%d:%b|%b" % (PLAN_VERSION, len(user), user, packed_keys))


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
    """All runs' token ids, concatenated, as little-endian int32: the app's, or the prompt's
    once bound (they are not sent: see the module docstring)."""
    cache_salt: str
    mac: str = ""
    wire: tuple[bytes, bytes] | tuple[()] = field(default=(), compare=False, repr=False)
    """slab_keys and lengths packed as in the params (hashed and sent as they are), set only
    by from_params / from_runs; () packs them when needed."""

    @classmethod
    def from_runs(cls, user_id: str, slab_keys: Sequence[int], runs: Sequence[bytes],
                  cache_salt: str | None = None, secret: bytes = b"") -> InjectionPlan:
        """Build from each run's token ids, packed (pack_token_ids), in prompt order (unsigned).

        Facts keep their ids packed (FactRecord.packed_ids), so a plan is a join, not a loop.
        cache_salt None: the salt of (user_id, slab_keys) under `secret`.

        Raises:
            PlanError: no runs, an empty or ragged run, or not one slab key per run.
        """
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
        return sum(self.lengths)

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
        user, salt = utf8(self.user_id), utf8(self.cache_salt)
        header = b"inject|%d|%d:%b|%d:%b|%d|" % (PLAN_VERSION, len(user), user, len(salt), salt,
                                                 len(self.lengths))
        keys, lengths = self.packed_keys_lengths()
        return header + keys + lengths + (self.tokens if tokens is None else tokens)

    def packed_keys_lengths(self) -> tuple[bytes, bytes]:
        """Slab keys (int64) and run lengths (int32), little-endian: `wire`, or packed now."""
        return self.wire or (_pack_keys(self.slab_keys), _pack_lengths(self.lengths))

    @classmethod
    def bound(cls, params: Mapping[str, Any] | None, prompt_token_ids: Sequence[int],
              secret: bytes) -> InjectionPlan | None:
        """The signed inject plan in `params`, bound to the prompt if its MAC verifies for it.

        The MAC is computed over the prompt's first sum(lengths) ids. None: no inject plan,
        malformed, forged, stale, or made for another prompt (they cannot be told apart: the
        plan carries no ids of its own). The returned plan's ids are the prompt's.
        """
        entry = params.get(PARAMS_KEY) if type(params) is dict else None
        if type(entry) is not dict or entry.get("kind") != "inject":
            return None  # the caller's full parse classifies it
        try:
            plan = from_params(params)
        except PlanError:
            return None
        assert isinstance(plan, InjectionPlan)  # kind "inject" parses to one
        n = plan.num_tokens
        try:
            tokens = pack_token_ids(prompt_token_ids[:n])
        except (struct.error, TypeError):  # an id that is no int32: not the plan's
            return None
        if len(tokens) != 4 * n:  # a prompt shorter than the plan
            return None
        if not hmac.compare_digest(utf8(plan.mac), utf8(mac_of(secret, plan._payload(tokens)))):
            return None
        return cls(plan.user_id, plan.slab_keys, plan.lengths, tokens, plan.cache_salt, plan.mac,
                   plan.wire)

    def signed(self, secret: bytes) -> InjectionPlan:
        """Copy with the MAC set."""
        return InjectionPlan(self.user_id, self.slab_keys, self.lengths, self.tokens,
                             self.cache_salt, mac_of(secret, self._payload()), self.wire)

    def with_client_salt(self, secret: bytes, client_salt: str) -> InjectionPlan:
        """Copy whose cache_salt is combined with a client's own (client_salted), signed."""
        if not client_salt:
            return self
        return InjectionPlan(self.user_id, self.slab_keys, self.lengths, self.tokens,
                             client_salted(secret, self.cache_salt, client_salt), "",
                             self.wire).signed(secret)

    def verify(self, secret: bytes) -> bool:
        """True if the MAC is valid for this content."""
        try:
            payload = self._payload()
        except struct.error:  # a key out of int64 (only a forged plan has one)
            return False
        return hmac.compare_digest(utf8(self.mac), utf8(mac_of(secret, payload)))

    def to_params(self) -> dict[str, Any]:
        """kv_transfer_params for SamplingParams(extra_args=...) or the OpenAI server."""
        keys, lengths = self.packed_keys_lengths()
        return {PARAMS_KEY: {
            "v": PLAN_VERSION, "kind": "inject", "user": self.user_id, "salt": self.cache_salt,
            "keys": b64(keys), "lengths": b64(lengths), "mac": self.mac,
        }}


Plan = InjectionPlan | SavePlan


def from_params(params: Mapping[str, Any] | None) -> Plan | None:
    """Parse kv_transfer_params. None if they carry no InferScale plan.

    An inject plan comes back without token ids (b""): they are the prompt's, bound by
    InjectionPlan.bound when its MAC is checked.

    Raises:
        PlanError: the InferScale entry is malformed, has unknown fields or is of another
            version. The MAC is not checked here.
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
    if kind == "local":  # handoff.py: only its engine's scheduler resolves it
        raise PlanError("an in-process plan reference ('local') cannot be parsed; only the "
                        "scheduler of the engine process that made it resolves it")
    user = str_field(raw, "user")
    mac = str_field(raw, "mac")
    if kind == "inject":
        if unknown := set(raw) - _INJECT_FIELDS:
            raise PlanError(f"inject plan has unknown fields {sorted(unknown)!r:.80}; build "
                            "plans with Engine, not by hand")
        keys_bytes = packed_field(raw, "keys", 8, "int64 slab keys")
        lengths_bytes = packed_field(raw, "lengths", 4, "int32 run lengths")
        keys = struct.unpack(f"<{len(keys_bytes) >> 3}q", keys_bytes)
        lengths = struct.unpack(f"<{len(lengths_bytes) >> 2}i", lengths_bytes)
        if len(keys) != len(lengths) or not keys:
            raise PlanError(f"inject plan needs as many 'keys' as 'lengths', at least one; got "
                            f"{len(keys)} and {len(lengths)}")
        if min(keys) < 0 or min(lengths) <= 0:
            raise PlanError("inject plan needs non-negative 'keys' and positive 'lengths'")
        return InjectionPlan(user, keys, lengths, b"", str_field(raw, "salt"), mac,
                             (keys_bytes, lengths_bytes))
    if kind == "save":
        return parse_save(raw, user, mac)
    raise PlanError(f"plan kind {kind!r} is unknown; expected 'inject' or 'save'")


_INJECT_FIELDS = frozenset({"v", "kind", "user", "salt", "keys", "lengths", "mac"})


def _pack_keys(slab_keys: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(slab_keys)}q", *slab_keys)


def _pack_lengths(lengths: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(lengths)}i", *lengths)


def _check_tiling(segments: tuple[Segment, ...]) -> None:
    position = 0
    for seg in segments:
        if seg.start != position or not seg.token_ids:
            raise PlanError(f"segments must be non-empty and tile the prompt from position 0; "
                            f"segment at {seg.start} expected at {position}")
        position = seg.end


