"""KV tiers: a fact evicted from the slab comes back from host RAM or disk as the very KV it was.

A fact demoted to host RAM and promoted back (keeping its host copy, so that evicting it again
moves nothing), or loaded from its disk entry (after eviction or a restart), injects bit-identical
KV: the same answer with the same logprobs (|dlogprob| = 0) as
before it left the slab. A corrupt, truncated or foreign disk entry is refused and the fact
encoded again (counted), never served. A deleted fact leaves no entry in any tier.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from inferscale_engine.facts import MemoryHandle
from inferscale_engine.model.check import kv_bytes_per_token
from tests.conftest import FACTS, QUESTIONS, engine_config, greedy, running_engine

pytestmark = pytest.mark.vllm

PAGE_TOKENS = 16


def _bytes(model: Path, tokens: int) -> int:
    from transformers import AutoConfig

    return tokens * kv_bytes_per_token(AutoConfig.from_pretrained(str(model)),
                                       engine_config(model))


def _fill(engine, user: str, count: int) -> list[int]:
    """Facts of another user, enough to push everything else out of a small slab."""
    texts = [f"{user} fact {i}: the meeting about project {i} is in room {i % 7}."
             for i in range(count)]
    return [f for lo in range(0, count, 4) for f in engine.add_facts(user, texts[lo:lo + 4])]


def _answer(engine, user: str, ids) -> tuple:
    out = engine.generate(MemoryHandle(user, tuple(ids)), QUESTIONS[0], greedy(6))
    assert out.plan_status == "inject", out.plan_status
    return out.token_ids, out.logprobs


def _counter(engine, name: str) -> int:
    return engine.stats().counters.get(name, 0)


def test_host_and_disk_round_trips_inject_bit_identical_kv(tiny_models, tmp_path):
    model = tiny_models["llama"]
    # A slab of ~640 tokens (a preamble and about a dozen facts), a host tier of ~8 facts.
    with running_engine(model, slab_capacity_bytes=_bytes(model, 640),
                        host_tier_bytes=_bytes(model, 400),
                        disk_tier_path=str(tmp_path / "disk")) as engine:
        ids = engine.add_facts("alice", FACTS[:3])
        tiers = engine.tiers_of([*ids, 10**9])  # disk files are written in the background
        assert set(tiers) == set(ids) and all(t[0] == "slab" for t in tiers.values())
        reference = _answer(engine, "alice", ids)
        _fill(engine, "bob", 12)  # alice's facts leave the slab for host RAM
        assert not any(engine.is_resident(f) for f in ids)
        assert engine.tiers_of(ids) == {f: ("host", "disk") for f in ids}  # what /ui shows
        assert engine.stats().num_host_facts >= 3
        hits = _counter(engine, "host_hits")
        assert _answer(engine, "alice", ids) == reference  # promoted from host RAM
        assert _counter(engine, "host_hits") - hits == 3
        _fill(engine, "carol", 30)  # out of the slab and out of host RAM: only disk has them
        assert not any(engine.is_resident(f) for f in ids)
        assert engine.tiers_of(ids) == {f: ("disk",) for f in ids}
        hits, encoded = _counter(engine, "disk_hits"), _counter(engine, "encoded_facts")
        assert _answer(engine, "alice", ids) == reference  # loaded from disk
        assert _counter(engine, "disk_hits") - hits == 3
        assert _counter(engine, "encoded_facts") == encoded  # nothing was encoded again
        totals = engine.stats().worker_totals
        assert totals["host_bytes_in"] > 0 and totals["host_bytes_out"] > 0
        assert totals["disk_bytes_read"] > 0 and totals["disk_writes"] >= 3 + 12 + 30


def test_the_host_tier_is_inclusive_an_evicted_fact_with_a_host_copy_moves_nothing(tiny_models):
    model = tiny_models["llama"]
    # A slab of about a dozen facts, a host tier that holds every fact: alice's 3 and bob's 12
    # cannot share the slab, so serving them in turn evicts one for the other each time.
    with running_engine(model, slab_capacity_bytes=_bytes(model, 640),
                        host_tier_bytes=_bytes(model, 4000)) as engine:
        alice = engine.add_facts("alice", FACTS[:3])
        reference = _answer(engine, "alice", alice)
        bob = _fill(engine, "bob", 12)
        assert engine.tiers_of(alice) == {f: ("host",) for f in alice}
        bob_reference = _answer(engine, "bob", bob)
        assert _answer(engine, "alice", alice) == reference  # promoted: the host copy stays
        assert engine.tiers_of(alice) == {f: ("slab", "host") for f in alice}
        assert _answer(engine, "bob", bob) == bob_reference  # every fact now has a host copy
        before, totals = engine.stats().counters, engine.stats().worker_totals
        for _ in range(2):
            assert _answer(engine, "alice", alice) == reference
            assert _answer(engine, "bob", bob) == bob_reference
        after, moved = engine.stats().counters, engine.stats().worker_totals
        assert after["evicted_facts"] - before["evicted_facts"] >= 6  # the slab did turn over
        assert after["host_hits"] - before["host_hits"] >= 6
        assert after["demoted_facts"] == before["demoted_facts"]  # ... with no copy out
        assert moved["host_bytes_in"] == totals["host_bytes_in"]  # nothing into host RAM
        assert moved["host_bytes_out"] > totals["host_bytes_out"]  # only back into the slab
        assert after.get("encoded_facts") == before.get("encoded_facts")


def _restart(model, disk: Path, texts, contexts=None, **overrides):
    """An engine over the same disk tier that registers `texts` under ids 1.. and encodes them."""
    from inferscale_engine.facts import Fact

    engine = running_engine(model, disk_tier_path=str(disk), **overrides)
    eng = engine.__enter__()
    facts = [Fact(i + 1, "alice", t, eng.tokenize_fact(t)) for i, t in enumerate(texts)]
    eng.add_tokenized_facts(facts, contexts)
    return engine, eng, [f.fact_id for f in facts]


def test_a_restart_loads_kv_from_disk_instead_of_encoding_it(tiny_models, tmp_path):
    model, disk = tiny_models["llama"], tmp_path / "disk"
    first, engine, ids = _restart(model, disk, FACTS)
    try:
        reference = _answer(engine, "alice", ids)
        assert _counter(engine, "encoded_facts") >= len(FACTS)
    finally:
        first.__exit__(None, None, None)
    assert len(list(disk.glob("*.safetensors"))) == len(FACTS)
    second, engine, ids = _restart(model, disk, FACTS)
    try:  # registered, nothing encoded: each fact's KV comes from disk on first use
        assert _counter(engine, "encoded_facts") == 1  # the preamble only
        assert not any(engine.is_resident(f) for f in ids)
        assert _answer(engine, "alice", ids) == reference
        assert _counter(engine, "disk_hits") == len(FACTS)
        assert _counter(engine, "encoded_facts") == 1
    finally:
        second.__exit__(None, None, None)


def _rewrite(path: Path, **meta: str) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        old = handle.metadata()
    save_file(tensors, str(path), metadata={**old, **meta})


def _reference_on_disk(model, disk: Path, texts) -> tuple:
    """Encode `texts` for alice into a disk tier; the answer they give."""
    first, engine, ids = _restart(model, disk, texts)
    try:
        return _answer(engine, "alice", ids)
    finally:
        first.__exit__(None, None, None)


def test_corrupt_truncated_and_foreign_entries_are_refused_and_reencoded(tiny_models,
                                                                         tmp_path):
    model, disk = tiny_models["llama"], tmp_path / "disk"
    reference = _reference_on_disk(model, disk, FACTS[:4])
    files = sorted(disk.glob("*.safetensors"))
    assert len(files) == 4
    data = files[0].read_bytes()
    files[0].write_bytes(data[:len(data) // 2])  # truncated
    flipped = bytearray(files[1].read_bytes())
    flipped[-5] ^= 0xFF  # a bit of the KV changed: the MAC refuses it
    files[1].write_bytes(bytes(flipped))
    _rewrite(files[2], model="another-model")  # another model's entry under this name
    second, engine, ids = _restart(model, disk, FACTS[:4])
    try:
        assert _answer(engine, "alice", ids) == reference  # never the damaged KV
        assert _counter(engine, "disk_hits") == 1
        assert _counter(engine, "disk_refused") == 3
        assert _counter(engine, "encoded_facts") == 1 + 3  # the preamble, the refused three
        totals = engine.stats().worker_totals
        assert totals["disk_corrupt"] == 2 and totals["disk_mismatch"] == 1
    finally:
        second.__exit__(None, None, None)


def test_forged_and_inconsistent_entries_are_refused_never_an_error(tiny_models, tmp_path):
    """Someone who can write the folder but lacks the key cannot plant KV under a user's name:
    another fact's KV under this entry's metadata with a recomputed unkeyed digest (what the
    checksum of format 1 accepted), and a header claiming more tokens than the fact has."""
    import hashlib

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    model, disk = tiny_models["llama"], tmp_path / "disk"
    reference = _reference_on_disk(model, disk, FACTS[:3])
    victim, donor, padded = sorted(disk.glob("*.safetensors"))
    with safe_open(str(donor), framework="pt") as handle:
        planted = {name: handle.get_tensor(name) for name in ("keys", "values")}
    with safe_open(str(victim), framework="pt") as handle:
        meta = dict(handle.metadata())
    digest = hashlib.blake2b(digest_size=16)
    for tensor in planted.values():
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    meta["mac"] = meta["checksum"] = digest.hexdigest()
    meta["num_tokens"] = str(planted["keys"].shape[1])
    save_file(planted, str(victim), metadata=meta)
    with safe_open(str(padded), framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in ("keys", "values")}
        meta = dict(handle.metadata())
    longer = {name: torch.cat([t, t, t, t], dim=1) for name, t in tensors.items()}
    save_file(longer, str(padded), metadata={**meta, "num_tokens": str(longer["keys"].shape[1])})
    second, engine, ids = _restart(model, disk, FACTS[:3])
    try:
        assert _answer(engine, "alice", ids) == reference  # served, never the planted KV
        assert _counter(engine, "disk_hits") == 1
        assert _counter(engine, "disk_refused") == 2
        totals = engine.stats().worker_totals
        assert totals["disk_corrupt"] == 1 and totals["disk_mismatch"] == 1
    finally:
        second.__exit__(None, None, None)


def test_the_disk_key_is_private_or_refused(tiny_models, tmp_path, monkeypatch):
    from inferscale_engine.config import DISK_KEY_ENV
    from inferscale_engine.errors import ConfigError
    from inferscale_engine.runtime.tier_manager import check_disk_tier

    monkeypatch.delenv(DISK_KEY_ENV, raising=False)
    folder = tmp_path / "tier"
    check_disk_tier(str(folder))
    key = folder / ".inferscale-disk-key"
    assert folder.stat().st_mode & 0o777 == 0o700 and key.stat().st_mode & 0o777 == 0o600
    assert len(bytes.fromhex(key.read_text())) == 32
    check_disk_tier(str(folder))  # the same key again
    key.chmod(0o644)
    with pytest.raises(ConfigError, match="key file .* `chmod 600"):
        check_disk_tier(str(folder))
    key.chmod(0o600)
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match="folder .* `chmod 700"):
        check_disk_tier(str(folder))
    monkeypatch.setenv(DISK_KEY_ENV, "not hex")
    with pytest.raises(ConfigError, match="64 hex digits"):
        check_disk_tier(str(folder))
    monkeypatch.setenv(DISK_KEY_ENV, "ab" * 32)  # an operator's key: no file needed
    check_disk_tier(str(tmp_path / "shared"))
    assert not (tmp_path / "shared" / ".inferscale-disk-key").exists()


def test_a_deleted_fact_leaves_no_entry_in_any_tier(tiny_models, tmp_path):
    model, disk = tiny_models["llama"], tmp_path / "disk"
    with running_engine(model, slab_capacity_bytes=_bytes(model, 640),
                        host_tier_bytes=_bytes(model, 400), disk_tier_path=str(disk)) as engine:
        ids = engine.add_facts("alice", FACTS)
        others = _fill(engine, "bob", 12)  # some of alice's facts now wait in host RAM
        engine.workers.flush_disk()
        assert len(list(disk.glob("*.safetensors"))) == len(FACTS) + 12
        engine.delete("alice", ids)
        engine.delete("bob", others)
        engine.workers.flush_disk()
        assert [p.name for p in disk.glob("*")] == [".inferscale-disk-key"]
        stats = engine.stats()
        assert stats.num_host_facts == 0 and stats.worker_totals["host_num_entries"] == 0
        assert stats.worker_totals["num_entries"] == 1  # the preamble


def test_eviction_under_concurrent_load_loses_no_request(tiny_models, tmp_path):
    model = tiny_models["llama"]
    # Room for the preamble and about a dozen facts of the 24 the 8 users have.
    with running_engine(model, slab_capacity_bytes=_bytes(model, 256),
                        host_tier_bytes=_bytes(model, 640),
                        disk_tier_path=str(tmp_path / "disk")) as engine:
        users = {f"user{i}": engine.add_facts(f"user{i}", FACTS[i % 3:i % 3 + 3])
                 for i in range(8)}
        references = {user: _answer(engine, user, ids) for user, ids in users.items()}
        failures: list[BaseException] = []

        def client(user: str) -> None:
            try:
                for _ in range(3):
                    assert _answer(engine, user, users[user]) == references[user]
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=client, args=(user,)) for user in users]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        counters = engine.stats().counters
        assert counters["evicted_facts"] > 0 and counters["host_hits"] > 0


def test_a_memory_restarts_from_disk_and_a_reset_user_leaves_no_file(tiny_models, tmp_path):
    from inferscale_engine.memory import Memory
    from tests.engine.memory.memory_support import HashEmbedder

    model, disk, db = tiny_models["llama"], tmp_path / "disk", tmp_path / "memory.db"
    with running_engine(model, disk_tier_path=str(disk)) as engine:
        with Memory(engine, db, HashEmbedder(), progress_bar=False) as memory:
            memory.add(user_id="alice", texts=FACTS[:3])
            memory.add(user_id="bob", texts=FACTS[3:])
            reference = memory.generate(user_id="alice", query=QUESTIONS[0], k=3,
                                        sampling=greedy(6))
    assert len(list(disk.glob("*.safetensors"))) == len(FACTS)
    with running_engine(model, disk_tier_path=str(disk)) as engine:
        with Memory(engine, db, HashEmbedder(), progress_bar=False) as memory:  # startup encode
            assert engine.stats().counters.get("encoded_facts") == 1  # the preamble only
            again = memory.generate(user_id="alice", query=QUESTIONS[0], k=3,
                                    sampling=greedy(6))
            assert (again.token_ids, again.logprobs) == (reference.token_ids, reference.logprobs)
            assert engine.stats().counters["disk_hits"] == 3
            memory.reset(user_id="alice")
            engine.workers.flush_disk()
            assert len(list(disk.glob("*.safetensors"))) == len(FACTS) - 3  # bob's remain


def test_tier_faults_are_clear_errors_at_start_or_counted_while_serving(tiny_models, tmp_path):
    from inferscale_engine.errors import ConfigError
    from inferscale_engine.runtime.engine import Engine

    model = tiny_models["llama"]
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="disk_tier_path .* cannot be written"):
        Engine(engine_config(model, disk_tier_path=str(blocker / "disk")))
    with pytest.raises(ConfigError, match="more than this machine's RAM"):
        Engine(engine_config(model, host_tier_bytes=2**60))
    disk = tmp_path / "disk"
    with running_engine(model, slab_capacity_bytes=_bytes(model, 256), host_tier_bytes=0,
                        disk_tier_path=str(disk)) as engine:
        ids = engine.add_facts("alice", FACTS[:2])
        reference = _answer(engine, "alice", ids)
        engine.workers.flush_disk()
        for path in disk.glob("*.safetensors"):  # a vanished entry: encoded again, counted
            path.unlink()
        _fill(engine, "bob", 12)
        encoded = _counter(engine, "encoded_facts")
        assert _answer(engine, "alice", ids) == reference
        assert _counter(engine, "encoded_facts") - encoded == 2
        assert _counter(engine, "disk_misses") >= 2
        # The folder is gone while serving (a full or lost disk): writes fail, are counted,
        # and serving goes on from the upper tiers.
        for path in disk.iterdir():
            path.unlink()
        disk.rmdir()
        disk.write_text("the disk tier's folder is now a file")
        more = engine.add_facts("carol", FACTS[2:4])
        engine.workers.flush_disk()
        assert engine.stats().worker_totals["disk_write_errors"] >= 2
        assert _answer(engine, "carol", more)[0]
