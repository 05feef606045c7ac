"""Token counts and content hashes for sources that publish text instead of token ids.

Default count: ``ceil(utf8_bytes / 4)`` for a non-empty text (0 for empty). Four bytes per token is
the usual rule of thumb for English with BPE tokenizers (GPT-2/Llama vocabularies); counting bytes
rather than characters makes CJK and other multi-byte text come out closer to real tokenizers,
which spend roughly one token per such character. It is fast (vectorised with pyarrow) and needs no
data file. A real tokenizer is used when the user passes a `tokenizer.json` path: it needs the
optional `tokenizers` package and never downloads anything.

Content hashes: equal text of the same segment kind gives the same 64-bit hash (never 0), so
identical system prompts and re-sent history share KV across requests and sessions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from kvsim.errors import KvsimError
from kvsim.textio import exists
from kvsim.traces.blocks import mix

__all__ = ["BYTES_PER_TOKEN", "TokenCounter", "content_hashes", "make_counter"]

BYTES_PER_TOKEN = 4
#: Hash key for `pandas.util.hash_array` (fixed, so hashes are stable across runs and machines).
_HASH_KEY = "kvsim-text-v1\x00\x00\x00"


class TokenCounter:
    """Counts tokens of many texts at once; the default is the bytes/4 approximation."""

    name = f"approx (ceil(utf8 bytes / {BYTES_PER_TOKEN}))"

    def count(self, texts: pa.Array | list[str]) -> np.ndarray:
        """Token count per text (int64); empty or null text counts 0."""
        arr = (
            texts if isinstance(texts, pa.Array | pa.ChunkedArray) else pa.array(texts, pa.string())
        )
        nbytes = pc.binary_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
        return -(-nbytes.astype(np.int64) // BYTES_PER_TOKEN)


class HFTokenizerCounter(TokenCounter):
    """Exact counts from a Hugging Face `tokenizer.json` (special tokens not added)."""

    def __init__(self, path: str | Path) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise KvsimError(
                "option 'tokenizer' needs the 'tokenizers' package: pip install 'kvsim[tokenizers]'"
            ) from None
        path = Path(path)
        if not (exists(path) and path.is_file()):
            raise KvsimError(f"option 'tokenizer': no such file {path}")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own exception types
            raise KvsimError(f"option 'tokenizer': cannot read {path}: {exc}") from None
        self.name = f"tokenizer {path.name}"

    def count(self, texts: pa.Array | list[str]) -> np.ndarray:
        values = texts.to_pylist() if isinstance(texts, pa.Array | pa.ChunkedArray) else texts
        values = [v or "" for v in values]
        encoded = self._tok.encode_batch(values, add_special_tokens=False)
        return np.fromiter((len(e.ids) for e in encoded), dtype=np.int64, count=len(values))


def make_counter(tokenizer: str | Path | None) -> TokenCounter:
    """The bytes/4 approximation, or a real tokenizer when a tokenizer.json path is given."""
    return TokenCounter() if tokenizer is None else HFTokenizerCounter(tokenizer)


def content_hashes(texts: pa.Array | list[str], kind_codes: np.ndarray | int) -> np.ndarray:
    """64-bit content hash per text, salted by segment kind; never 0 (vectorised SipHash)."""
    arr = texts if isinstance(texts, pa.Array | pa.ChunkedArray) else pa.array(texts, pa.string())
    values = arr.fill_null("").to_numpy(zero_copy_only=False)
    raw = pd.util.hash_array(values, hash_key=_HASH_KEY, categorize=False).astype(np.uint64)
    kinds = np.broadcast_to(np.asarray(kind_codes, dtype=np.uint64), raw.shape)
    return mix(np.uint64(0x74657874), raw, kinds) if raw.size else raw
