"""Child process of test_memory_crash: ingests facts through Memory on the real engine and prints
`ACK fact_id text` for every fact whose add() has returned, until it is killed.

    python -m tests.engine.memory.memory_crash_child DB MODEL NUM_FACTS BATCH
"""

from __future__ import annotations

import sys

from inferscale_engine.memory import Memory
from inferscale_engine.runtime.engine import Engine
from tests.engine.memory.memory_support import HashEmbedder, crash_engine_config, crash_texts


def main(db: str, model: str, num_facts: int, batch: int) -> None:
    memory = Memory(Engine(crash_engine_config(model, num_facts)), db, HashEmbedder(),
                    dedupe_threshold=None, progress_bar=False)
    texts = crash_texts(num_facts)
    print("READY", flush=True)
    for start in range(0, num_facts, batch):
        results = memory.add(user_id=f"user-{start // batch % 4}", texts=texts[start:start + batch])
        print("".join(f"ACK {r.fact_id} {r.text}\n" for r in results), end="", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
