"""Host buffers a step's load indices are written into, and how the kernel reads them."""

from __future__ import annotations

import numpy as np
import torch


class Staging:
    """Host buffers the step's load indices are written into, and how the kernel gets them.

    On CUDA: two pinned host buffers used in turn. With `zero_copy` (the default where the
    driver maps pinned memory for the device) the kernel reads the index straight from the
    pinned buffer, so a step pays no copy call; otherwise one asynchronous copy into a device
    buffer. A host buffer is written again two steps later, after waiting for the event
    recorded after its step's launch (long finished by then). Elsewhere: plain numpy.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._cuda = device.type == "cuda"
        self.zero_copy = self._cuda
        """The kernel reads the index from pinned host memory (set False where it cannot)."""
        self._hosts = [torch.empty(0, dtype=torch.int64) for _ in range(2)]
        self._host_arrays = [np.empty(0, dtype=np.int64) for _ in range(2)]  # the same memory
        self._events: list[torch.cuda.Event | None] = [None, None]
        self._stream: torch.cuda.Stream | None = None
        self._device_index = (device.index if device.index is not None
                              else torch.cuda.current_device()) if self._cuda else -1
        self._turn = 0
        self._device_buffer = torch.empty(0, dtype=torch.int64, device=device)
        self._view = np.empty((4, 0), dtype=np.int64)

    def host(self, num_tokens: int) -> np.ndarray:
        """A writable [4, num_tokens] int64 buffer for this step (contiguous)."""
        if not self._cuda:
            self._view = np.empty((4, num_tokens), dtype=np.int64)
            return self._view
        self._turn ^= 1
        event = self._events[self._turn]
        if event is not None:
            event.synchronize()
        array = self._host_arrays[self._turn]
        if array.size < 4 * num_tokens:
            buffer = self._hosts[self._turn] = torch.empty(
                max(4 * num_tokens, 2 * array.size), dtype=torch.int64, pin_memory=True)
            array = self._host_arrays[self._turn] = buffer.numpy()
        self._view = array[:4 * num_tokens].reshape(4, num_tokens)
        return self._view

    def index(self, num_tokens: int) -> torch.Tensor:
        """The first num_tokens columns of this step's buffer as the kernel's [4, n] index.

        The pinned host buffer itself (zero copy) or its copy on the device. Rows keep the
        buffer's row stride (the kernels take it), so nothing is compacted.
        """
        # Sliced only when a load failed: every step fills all it asked for otherwise, and the
        # slice costs as much as the tensor itself (~20 us each with cold caches).
        whole = num_tokens == self._view.shape[1]
        if not self._cuda or self.zero_copy:  # on CUDA the pinned buffer, at the same address
            index = torch.from_numpy(self._view)
            return index if whole else index[:, :num_tokens]
        size = self._view.size
        if self._device_buffer.numel() < size:
            self._device_buffer = torch.empty(max(size, 2 * self._device_buffer.numel()),
                                              dtype=torch.int64, device=self._device)
        flat = self._device_buffer[:size]
        flat.copy_(self._hosts[self._turn][:size], non_blocking=True)
        index = flat.view(self._view.shape)
        return index if whole else index[:, :num_tokens]

    def launched(self) -> None:
        """Mark this step's buffer in use until the work queued so far has run."""
        if not self._cuda:
            return
        event = self._events[self._turn] = self._events[self._turn] or torch.cuda.Event()
        # The current stream as a Stream object, built again only when it changes
        # (torch.cuda.current_stream() builds one per call: tens of microseconds, cold).
        raw = torch._C._cuda_getCurrentRawStream(self._device_index)
        if self._stream is None or self._stream.cuda_stream != raw:
            self._stream = torch.cuda.current_stream(self._device)
        event.record(self._stream)
