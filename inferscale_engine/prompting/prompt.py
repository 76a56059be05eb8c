"""Prompts assembled from token ids: [preamble][fact_1]..[fact_k][rest of the chat].

The chat template is rendered once per request with a marker at the end of the system message
(where the memory block goes); the text before the marker is the preamble, the text after it
is the rest. Each piece is tokenized on its own and never re-tokenized as a whole, so the token
ids of a stored fact are exactly the ids in the prompt, in KV mode and in text mode alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferscale_engine.checks import ROLES
from inferscale_engine.errors import InvalidRequestError, UnsupportedModelError
from inferscale_engine.prompting.layout import USER_BLOCK_HEADER

FACT_FORMAT = "- {text}\n"
TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
_MARK = "<<INFERSCALE-MEMORY-BLOCK>>"
_PROBES = ("", "Hi", "- Dan collects old maps.\n", "  two  spaces,\ttabs\n\nand lines  ",
           "naïve café: 東京, ✓ 🚀 Ω ß", "<|im_end|><|endoftext|><s></s>[INST] <think>")
"""Chat tails (special tokens, whitespace, non-ASCII) a tokenizer's backend must encode as the
tokenizer does before PromptBuilder encodes through it."""


@dataclass(frozen=True, slots=True)
class MemoryPrompt:
    """A prompt split into its injectable prefix pieces and the rest."""

    preamble: tuple[int, ...]
    facts: tuple[tuple[int, ...], ...]
    """Facts whose KV is injected (text mode prefills them in place)."""
    rest: tuple[int, ...]
    repaired: tuple[tuple[int, ...], ...] = ()
    """Facts prefilled as text right after `facts` (suffix repair, placement 'memory')."""

    def token_ids(self) -> list[int]:
        """The whole prompt."""
        ids = list(self.preamble)
        for fact in (*self.facts, *self.repaired):
            ids.extend(fact)
        ids.extend(self.rest)
        return ids

    def fact_starts(self) -> list[int]:
        """Serving position of each fact's first token."""
        starts, position = [], len(self.preamble)
        for fact in self.facts:
            starts.append(position)
            position += len(fact)
        return starts


class PromptBuilder:
    """Renders chats with the tokenizer's template around a memory block."""

    def __init__(self, tokenizer: Any, system_prompt: str,
                 user_block_header: str = USER_BLOCK_HEADER) -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise UnsupportedModelError("the tokenizer has no chat template; InferScale needs one "
                                   "to place the memory block")
        self._tokenizer = tokenizer
        self._system_prompt = system_prompt
        self._user_block_header = user_block_header
        self._preambles: dict[str, tuple[int, ...]] = {}
        """Rendered preamble text -> token ids: the same few system prompts recur."""
        try:  # the probes as chats: preamble and tail pieces, around the template's own tokens
            probes = [part for text in _PROBES
                      for part in self._render([{"role": "user", "content": text}])]
        except Exception:  # a template that fails here fails the first request the same way
            probes = list(_PROBES)
        self._backend = _same_backend(tokenizer, probes)

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of `text` without special tokens added.

        Through the tokenizer's Rust backend when it encodes the probe texts exactly as the
        tokenizer does (a third of the time per call, paid by every request), while no
        truncation or padding is set on it; otherwise, or if it refuses the text, the
        tokenizer's own call (its ids, or its error).
        """
        backend = self._backend
        if backend is not None and backend.truncation is None and backend.padding is None:
            try:
                return tuple(backend.encode(text, add_special_tokens=False).ids)
            except Exception:  # the tokenizer's own call decides below
                pass
        return tuple(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def batch_encoder(self, texts: Sequence[str]) -> Callable[[str], tuple[int, ...]]:
        """encode(), with `texts` encoded up front in one batch (the Rust backend's threads).

        The returned function looks them up, and encodes any other text as encode() does.
        """
        backend = self._backend
        done: dict[str, tuple[int, ...]] = {}
        if texts and backend is not None and backend.truncation is None and (
                backend.padding is None):
            try:
                batch = backend.encode_batch(list(texts), add_special_tokens=False)
                done = {t: tuple(e.ids) for t, e in zip(texts, batch, strict=True)}
            except Exception:  # encode() decides per text below
                done = {}
        return lambda text: done[text] if text in done else self.encode(text)

    def fact_ids(self, text: str) -> tuple[int, ...]:
        """Token ids of one fact as it appears in the memory block."""
        return self.encode(FACT_FORMAT.format(text=text))

    def build(self, messages: Sequence[Mapping[str, str]], facts: Sequence[Sequence[int]],
              repaired: Sequence[Sequence[int]] = (), user_block: Sequence[str] = (),
              tools: Sequence[Mapping[str, Any]] | None = None) -> MemoryPrompt:
        """Prompt for `messages` (role/content dicts) with `facts` in the system message.

        Args:
            facts: token ids of the facts of the memory block (injected in kv mode).
            repaired: token ids of facts written right after them (prefilled as text).
            user_block: texts of facts written as a block (under the user-block header) at
                the start of the last user message (prefilled as text).
            tools: tool schemas (OpenAI function format) for the model's own chat template.
        """
        if user_block:
            messages = _with_user_block(messages, user_block, self._user_block_header)
        head, tail = self._render(messages, tools)
        return MemoryPrompt(self._preamble_ids(head), tuple(tuple(f) for f in facts),
                            self.encode(tail), tuple(tuple(f) for f in repaired))

    def preamble(self, messages: Sequence[Mapping[str, str]] = ()) -> tuple[int, ...]:
        """Preamble token ids for these messages (depends only on their system message)."""
        return self._preamble_ids(self._render(messages)[0])

    def _preamble_ids(self, head: str) -> tuple[int, ...]:
        ids = self._preambles.get(head)
        if ids is None:
            if len(self._preambles) >= 256:
                self._preambles.clear()
            ids = self._preambles[head] = self.encode(head)
        return ids

    def _apply(self, chat: list[dict[str, str]], tools: Sequence[Mapping[str, Any]] | None
               ) -> str:
        """The chat template's text, with tools rendered by the template.

        A template that ignores tools gets a Hermes-style section at the end of the system
        message instead.
        """
        rendered = self._tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True,
            **({"tools": list(tools)} if tools else {}))
        if tools and rendered == self._tokenizer.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=True):
            chat = [{**chat[0], "content": chat[0]["content"] + tools_section(tools)}, *chat[1:]]
            rendered = self._tokenizer.apply_chat_template(chat, tokenize=False,
                                                           add_generation_prompt=True)
        return str(rendered)

    def _render(self, messages: Sequence[Mapping[str, str]],
                tools: Sequence[Mapping[str, Any]] | None = None) -> tuple[str, str]:
        chat = [dict(m) for m in messages]
        for m in chat:
            if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise InvalidRequestError(f"message {m!r:.80} needs role in {ROLES} and text "
                                          "content")
        system = self._system_prompt
        if chat and chat[0]["role"] == "system":
            system = chat.pop(0)["content"].rstrip() + "\n\n" + system
        rendered = self._apply([{"role": "system", "content": system + _MARK}, *chat], tools)
        head, mark, tail = rendered.partition(_MARK)
        if not mark or _MARK in tail:
            raise UnsupportedModelError("the chat template altered the memory marker; this "
                                        "tokenizer's template is not supported")
        return head, tail


def _same_backend(tokenizer: Any, probes: Iterable[str]) -> Any | None:
    """The tokenizer's Rust backend if it encodes every probe exactly as the tokenizer does.

    Each probe is checked alone and twice in a row; None if any differs or raises. (The
    tokenizer's own call clears the backend's truncation and padding; `encode` checks them on
    every call.)
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "encode"):
        return None
    try:
        for text in probes:
            for probe in (text, text + text):
                expected = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
                if list(backend.encode(probe, add_special_tokens=False).ids) != expected:
                    return None
    except Exception:
        return None
    return backend


def tools_section(tools: Sequence[Mapping[str, Any]]) -> str:
    """Hermes-style tool description, for chat templates that do not render tools."""
    lines = "\n".join(json.dumps(dict(t), ensure_ascii=False) for t in tools)
    return (TOOLS_HEADER + lines + TOOLS_FOOTER)


def _with_user_block(messages: Sequence[Mapping[str, str]], texts: Sequence[str],
                     header: str) -> list[Mapping[str, str]]:
    """`messages` with a block of fact texts at the start of the last user message."""
    block = header + "".join(FACT_FORMAT.format(text=t) for t in texts) + "\n"
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        if out[i].get("role") == "user":
            out[i] = {**out[i], "content": block + str(out[i].get("content", ""))}
            return out
    return [*out, {"role": "user", "content": block}]
