"""benchmarks/gpu/floor_probe.py's ablations do what they say (the real engine, tiny model).

Each kv variant must still inject its memory (a variant that claims nothing measures a text
prefill, not an injection's floor: the first draft's trusted plan had no token count and
claimed 0), and each switch must fire once per request of its variants.
"""

from __future__ import annotations

from benchmarks.gpu import floor_probe


def test_every_variant_injects_and_every_switch_fires(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERSCALE_RESULTS", str(tmp_path))
    rounds = 2
    record = floor_probe.main(["--model", "tiny", "--k", "20", "--requests", str(rounds),
                               "--warmup", "1", "--pool", "60", "--max-model-len", "4096",
                               "--slab-mib", "64"])
    entry = record["k"][20]["summary"]
    for variant in ("kv", "kv-trusted", "kv-nocopy", "kv-noload", "kv-floor", "kv-copyindex",
                    "kv-aftertext"):
        assert entry[variant]["injected_median"] > 400, variant  # preamble + 20 facts
        assert entry[variant]["paired_wall"]["n"] == rounds
        assert entry[variant]["paired_wall_afterkv"]["n"] == rounds
    for resident in ("resident", "resident-afterkv"):  # served from the prefix cache
        assert entry[resident]["cached_median"] > 300, resident  # preamble + 20 facts, whole blocks
        assert entry[resident]["injected_median"] == 0, resident
    # trusted: kv-trusted and kv-floor; noload: kv-noload and kv-floor; nocopy and copyindex:
    # one load each
    assert entry["switch_counts"] == {"trusted": 2 * rounds, "noload": 2 * rounds,
                                      "nocopy": rounds, "copyindex": rounds}
    assert list(tmp_path.glob("floor_probe-tiny-*.json"))
