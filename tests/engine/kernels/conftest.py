"""Kernel tests run Triton's CPU interpreter unless TRITON_INTERPRET is set otherwise.

Triton reads the variable when a kernel is decorated, so this must run before
`inferscale_engine.kernels.chunked_rope` is first imported. Set TRITON_INTERPRET=0 on a CUDA
machine to test the compiled kernels with the same file.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
