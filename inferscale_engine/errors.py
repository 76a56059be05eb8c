"""Exception classes. Each message says what failed, the bad value and what to do."""

from __future__ import annotations


class InferScaleError(Exception):
    """Base class of every error InferScale raises on purpose."""


class ConfigError(InferScaleError, ValueError):
    """An EngineConfig / ConnectorConfig value is invalid."""


class UnsupportedModelError(InferScaleError, ValueError):
    """The model's architecture or RoPE variant cannot be served with stored KV."""


class PlanError(InferScaleError, ValueError):
    """kv_transfer_params are malformed, of another version, or fail authentication."""


class SlabFullError(InferScaleError, RuntimeError):
    """The KV slab has no room left for the facts being added."""


class FactNotFoundError(InferScaleError, KeyError):
    """A fact id is unknown (never added, or deleted)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class HandleError(InferScaleError, PermissionError):
    """A memory handle references facts of another user or is not a handle at all."""


class InvalidFactError(InferScaleError, ValueError):
    """A fact text is empty, not text, or longer than the configured token limit."""


class EngineClosedError(InferScaleError, RuntimeError):
    """The engine was shut down."""


class InvalidRequestError(InferScaleError, ValueError):
    """A generate() call's messages, handle or sampling settings are invalid."""


class InvalidUserIdError(InferScaleError, ValueError):
    """A user_id is not a non-empty string of valid Unicode."""


class InvalidTurnError(InferScaleError, ValueError):
    """A conversation turn's session id, role or content is invalid."""


class StoreError(InferScaleError, RuntimeError):
    """The fact database cannot be opened, migrated or written, or the store is closed."""


class EmbedderError(InferScaleError, RuntimeError):
    """The sentence-transformers model cannot be imported or loaded."""


class RetrievalError(InferScaleError, ValueError):
    """Texts, embeddings, fact ids or k given to the embedder or a retrieval index are invalid."""


class AddQueueFullError(InferScaleError, RuntimeError):
    """An asynchronous add was refused: the background queue holds its most facts (HTTP 429)."""
