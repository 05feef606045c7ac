"""kvsim: a discrete-event simulator of KV-cache management in LLM serving."""

from kvsim.compiled import stale_extensions as _stale_extensions

__version__ = "0.1.0"

if _stale := _stale_extensions():
    raise ImportError(
        f"kvsim: {', '.join(_stale)} changed since it was compiled: build again "
        "(KVSIM_COMPILE=1 python setup.py build_ext --inplace) or delete the extensions "
        "(README, 'Compiled build')"
    )
