"""chat_openai: LangChain's ChatOpenAI pointed at `inferscale serve`, answering as one user.

The server serves the user's facts as injected KV; this only sets the user (X-User-Id, which
survives a per-call extra_body) and the memory options (extra_body={"memory": {...}}). Needs
the `client` extra: pip install 'inferscale-kv[client]'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from inferscale_integrations.client import client_settings

if TYPE_CHECKING:
    from langchain_openai import ChatOpenAI


def chat_openai(*, base_url: str, user_id: str, api_key: str | None = None,
                session_id: str | None = None, k: int | None = None,
                recent_facts: int | None = None, write: bool | None = None,
                model: str | None = None, **kwargs: Any) -> ChatOpenAI:
    """A ChatOpenAI whose every request is served with `user_id`'s memory.

    Args:
        base_url: the server, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).
        user_id: whose memory answers.
        api_key: a key reaching `user_id` (default: $INFERSCALE_API_KEY).
        session_id, k, recent_facts, write: the request's memory options (None: the
            server's defaults); recent_facts adds the session's last facts to the top-k.
        model: the served model's name (None: asked from the server, GET /v1/models).
        kwargs: ChatOpenAI's own (max_tokens, temperature, ...); response headers are
            included by default (response_metadata["headers"] shows what was injected).

    Raises:
        ImportError: langchain-openai is not installed.
    """
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as exc:
        raise ImportError("chat_openai needs langchain-openai; install it with: pip install "
                          "'inferscale-kv[client]'") from exc
    settings = client_settings(
        base_url=base_url, user_id=user_id, api_key=api_key, session_id=session_id, k=k,
        recent_facts=recent_facts, write=write, model=model,
        default_headers=kwargs.pop("default_headers", None))
    extra_body = {**(kwargs.pop("extra_body", None) or {}), "memory": settings.memory}
    kwargs.setdefault("include_response_headers", True)
    return ChatOpenAI(model=settings.model, base_url=settings.url,
                      api_key=SecretStr(settings.api_key), default_headers=settings.headers,
                      extra_body=extra_body, **kwargs)
