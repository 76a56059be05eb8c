"""Where vLLM keeps its OpenAI server's pieces.

vllm.entrypoints.launchers in 0.32 (the CPU build); vllm.entrypoints.openai and
vllm.entrypoints.launcher in 0.26 (the GPU build).
"""

from __future__ import annotations

# ruff: noqa: F401  (re-exports)
try:  # vLLM 0.32
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.api_server.entry import (
        build_async_engine_client_from_engine_args,
    )
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server
except ImportError:  # vLLM 0.26
    from vllm.entrypoints.launcher import serve_http  # type: ignore[no-redef]
    from vllm.entrypoints.openai.api_server import (  # type: ignore[no-redef]
        build_app,
        build_async_engine_client_from_engine_args,
        init_app_state,
        setup_server,
    )
    from vllm.entrypoints.openai.cli_args import (  # type: ignore[no-redef]
        make_arg_parser,
        validate_parsed_serve_args,
    )
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
