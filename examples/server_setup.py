"""What the server examples share: their command line, and Caroline's facts on the server.

The examples start nothing: they talk to a running `inferscale serve`. Start one first:
    inferscale serve small --port 8000      # Qwen2.5-Coder-0.5B ('inferscale-kv[smallmodel]')
    inferscale serve /path/to/model --port 8000
With --api-keys FILE, pass --api-key (or set INFERSCALE_API_KEY) with a key reaching the user.
"""

from __future__ import annotations

import argparse

from inferscale_engine.cli import DEMO_FACTS
from inferscale_integrations import MemoryClient

USER_ID = "caroline"
"""The user the examples talk to; remember_demo_facts gives her a few long-term facts."""


def remember_demo_facts(base_url: str, api_key: str | None, user_id: str) -> None:
    """Add Caroline's facts through the memory REST API, unless the user has some already."""
    with MemoryClient(base_url, api_key) as memories:
        if not memories.get_all(user_id=user_id):
            memories.add(user_id=user_id, texts=DEMO_FACTS)  # stored and encoded as KV once


def parse_args(description: str) -> argparse.Namespace:
    """--base-url, --api-key, --user and --max-tokens, shared by the server examples."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000",
                        help="the running `inferscale serve`")
    parser.add_argument("--api-key", default=None, help="default: $INFERSCALE_API_KEY")
    parser.add_argument("--user", default=USER_ID)
    parser.add_argument("--max-tokens", type=int, default=48)
    return parser.parse_args()
