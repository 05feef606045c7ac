"""``auto``: MetaKV-style, one of several candidate profiles per request.

Our reconstruction (docs/compression.md): each request, as it arrives, gets the highest-quality
candidate whose predicted decode step and memory fit the run's budgets
(``kvsim.compression.choose``). The engine asks each candidate, never ``auto`` itself; as a
profile ``auto`` answers for its largest candidate (a reservation bound).
"""

from __future__ import annotations

from kvsim.compression.base import Compression, check_tokens, salt_of
from kvsim.errors import ConfigError

#: What plain ``auto`` chooses among: each profile's published default, uncompressed first.
DEFAULT_AUTO_CANDIDATES: tuple[str, ...] = (
    "none",
    "quant:k=8,v=8",
    "quant:k=4,v=4",
    "snapkv",
    "h2o",
    "quant:k=2,v=2",
    "streaming",
)


class Auto(Compression):
    name = "auto"
    summary = (
        "MetaKV-style: one of several candidate profiles per request under latency and "
        "memory budgets"
    )
    source = "reconstruction (see docs/compression.md)"
    per_request_choice = True
    unpublished = "auto picks a candidate per request; ask about the chosen candidate"

    @property
    def drops_tokens(self) -> bool:  # type: ignore[override]
        return any(c.drops_tokens for c in self.candidates)

    @classmethod
    def parse(cls, rest: str) -> Compression:
        """Candidates separated by '|', each a full profile text; none: the defaults."""
        from kvsim.compression.profiles import parse_compression

        texts = (
            [t.strip() for t in rest.split("|")] if rest.strip() else list(DEFAULT_AUTO_CANDIDATES)
        )
        candidates: list[Compression] = []
        for t in texts:
            if t.split(":", 1)[0].strip() == cls.name:
                raise ConfigError("compression auto: a candidate cannot itself be auto")
            cand = parse_compression(t)
            if cand.label not in {c.label for c in candidates}:
                candidates.append(cand)
        label = "auto:" + "|".join(c.label for c in candidates)
        return cls(label=label, salt=salt_of(label), candidates=tuple(candidates))

    def kept_tokens(
        self, context_tokens: int, layer: int | None = None, generated_tokens: int = 0
    ) -> int:
        n, g = check_tokens(context_tokens, generated_tokens)
        return max(c.kept_tokens(n, layer, g) for c in self.candidates)

    def read_tokens(
        self, context_tokens: int, layer: int | None = None, generated_tokens: int = 0
    ) -> int:
        n, g = check_tokens(context_tokens, generated_tokens)
        return max(c.read_tokens(n, layer, g) for c in self.candidates)
