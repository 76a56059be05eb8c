"""Chunked RoPE kernels: Triton (chunked_rope) and the plain-torch reference."""
