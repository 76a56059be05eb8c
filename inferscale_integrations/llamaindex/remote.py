"""openai_like: LlamaIndex's OpenAILike pointed at `inferscale serve`, answering as one user.

The server serves the user's facts as injected KV; this only sets the user (X-User-Id) and the
memory options (additional_kwargs' extra_body={"memory": {...}}: OpenAILike sends
additional_kwargs with every call). Needs the `client` extra:
pip install 'inferscale-kv[client]'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferscale_integrations.client import client_settings

if TYPE_CHECKING:
    from llama_index.llms.openai_like import OpenAILike


def openai_like(*, base_url: str, user_id: str, api_key: str | None = None,
                session_id: str | None = None, k: int | None = None,
                recent_facts: int | None = None, write: bool | None = None,
                model: str | None = None, **kwargs: Any) -> OpenAILike:
    """An OpenAILike chat model whose every request is served with `user_id`'s memory.

    Args:
        base_url: the server, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).
        user_id: whose memory answers.
        api_key: a key reaching `user_id` (default: $INFERSCALE_API_KEY).
        session_id, k, recent_facts, write: the request's memory options (None: the
            server's defaults); recent_facts adds the session's last facts to the top-k.
        model: the served model's name (None: asked from the server, GET /v1/models).
        kwargs: OpenAILike's own (max_tokens, temperature, context_window, ...);
            is_chat_model defaults to True (the chat API).

    Raises:
        ImportError: llama-index-llms-openai-like is not installed.
    """
    try:
        from llama_index.llms.openai_like import OpenAILike
    except ImportError as exc:
        raise ImportError("openai_like needs llama-index-llms-openai-like; install it with: "
                          "pip install 'inferscale-kv[client]'") from exc
    settings = client_settings(
        base_url=base_url, user_id=user_id, api_key=api_key, session_id=session_id, k=k,
        recent_facts=recent_facts, write=write, model=model,
        default_headers=kwargs.pop("default_headers", None))
    additional = dict(kwargs.pop("additional_kwargs", None) or {})
    additional["extra_body"] = {**(additional.get("extra_body") or {}), "memory": settings.memory}
    kwargs.setdefault("is_chat_model", True)
    return OpenAILike(model=settings.model, api_base=settings.url, api_key=settings.api_key,
                      default_headers=settings.headers, additional_kwargs=additional, **kwargs)
