#!/usr/bin/env bash
# Stage the vLLM GPU bundle on the lent H200 in four device calls (the working tree, ~34 MB, plus
# one of the two ~52 MB parts that ../shared/device/build-vllm-gpu-bundle.sh writes exceeds the
# 64 MiB a call may carry). Split once, here:
#   cat .device/a/part.00 .device/b/part.01 > /tmp/bundle.xz && split -n 4 -d -a 1 /tmp/bundle.xz /tmp/part.
#   for i in 0 1 2 3; do mkdir -p .device/p$((i + 1)); mv /tmp/part.$i .device/p$((i + 1))/; done
# then four back-to-back `run` calls (the machine goes back after ~30 s idle):
#   bash benchmarks/gpu/stage_bundle.sh   carrying .device/p1, then p2, p3, p4
# The call that brings the last part unpacks the bundle into /tmp/site (PYTHONPATH of run_h200.sh).
set -e
mkdir -p /tmp/vb
if [ -f /tmp/site/vllm/__init__.py ]; then echo "bundle already unpacked"; exit 0; fi
for d in .device/p1 .device/p2 .device/p3 .device/p4; do [ -d "$d" ] && cp "$d"/part.* /tmp/vb/; done
ls /tmp/vb
if [ -f /tmp/vb/part.0 ] && [ -f /tmp/vb/part.1 ] && [ -f /tmp/vb/part.2 ] && [ -f /tmp/vb/part.3 ]; then
  python3 - <<'P'
import io, tarfile
class Cat(io.RawIOBase):  # the parts read as one stream (no second copy on disk)
    def __init__(self, paths): self.fs = [open(p, "rb") for p in paths]; self.i = 0
    def readable(self): return True
    def readinto(self, b):
        while self.i < len(self.fs):
            n = self.fs[self.i].readinto(b)
            if n: return n
            self.i += 1
        return 0
src = io.BufferedReader(Cat([f"/tmp/vb/part.{i}" for i in range(4)]), 1 << 20)
tarfile.open(fileobj=src, mode="r|xz").extractall("/tmp/site")
P
  echo "vLLM bundle unpacked into /tmp/site"
fi
