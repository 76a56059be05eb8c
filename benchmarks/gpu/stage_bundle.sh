#!/usr/bin/env bash
# Stage the vLLM GPU bundle on the lent H200 in N device calls: a call may carry 64 MiB, the
# working tree takes a few MB, and the bundle that
# ../shared/device/build-vllm-gpu-bundle.sh writes is ~105 MB in two parts. Split it once, here,
# into parts small enough for the tree (N=6: ~17.5 MB each):
#   bash benchmarks/gpu/stage_bundle.sh --split 6
# then N back-to-back `run` calls (the machine goes back after ~30 s idle):
#   bash benchmarks/gpu/stage_bundle.sh   carrying .device/p1, then p2, ..., pN
# Each part folder holds its part and the count N; the call that brings the last missing part
# unpacks the bundle into /tmp/site (PYTHONPATH of run_h200.sh).
set -e
if [ "${1:-}" = "--split" ]; then  # on this machine: .device/a, .device/b -> .device/p1..pN
  n=${2:?usage: stage_bundle.sh --split N}
  rm -rf .device/p[0-9]* && cat .device/a/part.00 .device/b/part.01 > /tmp/bundle.xz
  split -n "$n" -d -a 2 /tmp/bundle.xz /tmp/bundle-part.
  for i in $(seq 0 $((n - 1))); do
    d=.device/p$((i + 1)); mkdir -p "$d"
    mv "/tmp/bundle-part.$(printf %02d "$i")" "$d/part.$i"; echo "$n" > "$d/of"
  done
  rm -f /tmp/bundle.xz; du -sh .device/p*; exit 0
fi
mkdir -p /tmp/vb
if [ -f /tmp/site/vllm/__init__.py ]; then echo "bundle already unpacked"; exit 0; fi
for d in .device/p*; do [ -d "$d" ] && cp "$d"/part.* "$d"/of /tmp/vb/; done
n=$(cat /tmp/vb/of 2>/dev/null || echo 0)
have=$(ls /tmp/vb | grep -c '^part\.' || true)
echo "parts here: $have of $n"
if [ "$n" -gt 0 ] && [ "$have" -eq "$n" ]; then
  N="$n" python3 - <<'P'
import io, os, tarfile
class Cat(io.RawIOBase):  # the parts read as one stream (no second copy on disk)
    def __init__(self, paths): self.fs = [open(p, "rb") for p in paths]; self.i = 0
    def readable(self): return True
    def readinto(self, b):
        while self.i < len(self.fs):
            n = self.fs[self.i].readinto(b)
            if n: return n
            self.i += 1
        return 0
src = io.BufferedReader(Cat([f"/tmp/vb/part.{i}" for i in range(int(os.environ["N"]))]), 1 << 20)
tarfile.open(fileobj=src, mode="r|xz").extractall("/tmp/site")
P
  echo "vLLM bundle unpacked into /tmp/site"
fi
