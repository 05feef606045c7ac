"""What a compression profile is: the ``Compression`` base class every profile module subclasses.

A profile is one class in one module of ``kvsim.compression.profiles`` (registered there by name),
and a parsed configuration is one frozen instance of it. The class declares the profile's keys,
their defaults and the source of each default (STYLE.md habit 8), and answers everything callers
need through attributes and methods, so no caller tests a profile's name:

- what it keeps: ``kept_tokens`` (per KV head of a layer, as a function of the context and of the
  generated part), from the profile's own rule ``keep``; ``keep_ratio`` and ``layer_count`` for
  per-layer profiles; ``exact_tokens``, the leading tokens that stay at their positions when it
  drops others (so their pages stay reusable by hash);
- what it reads per decode step: ``read_tokens`` (the kept tokens unless it fetches a budget);
- how it stores a kept token: ``layer_bits`` (K and V bits, group), ``residual_tokens`` (recent
  tokens at full width) and ``gpu_token_bytes`` (a layer's GPU bytes per kept token);
- what it costs: ``add_layer_work`` (scoring, top-k, speculation per layer; quantising is
  priced from ``layer_bits`` for every profile) and ``work_notes`` (work no figure prices);
- its quality proxy: ``quality_budget`` / ``quality_keys`` (how published points are matched),
  ``fixed_quality_points`` (points that replace the table), ``unpublished`` and
  ``budget_note`` (why no number applies);
- kinds: ``identity`` (none: the engine's uncompressed path), ``drops_tokens``,
  ``prompt_only``, ``offloaded`` (KV in CPU DRAM), ``per_request_choice`` (auto: one of its
  ``candidates`` per request), and the engine's ``drops`` and ``linear_reads``.

Byte sizes are computed from these answers by ``kvsim.compression.sizing`` and quality points by
``kvsim.compression.quality``; the profiles themselves know no model, so one parsed profile serves
every model.

Token counts: ``context_tokens`` is the whole sequence so far; ``generated_tokens`` the part the
model produced (0 during and right after prefill). Profiles that compress the *prompt* once after
prefill (``prompt_only``) keep every generated token; the others apply their rule to the whole
context. Ratios are exact fractions parsed from the decimal text, so ``ceil(0.15 × 100)`` is 15,
not the 16 that binary floating point gives.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

from kvsim.errors import ConfigError

if TYPE_CHECKING:
    from kvsim.compression.quality import QualityPoint
    from kvsim.compression.sizing import LayerBytes

__all__ = [
    "MAX_LAYERS",
    "Amount",
    "Compression",
    "Key",
    "LayerConfig",
    "WorkAdder",
    "amount_text",
    "amount_tokens",
    "check_tokens",
    "parse_value",
    "pick",
    "ratio_text",
    "salt_of",
    "value_text",
]

Amount = Fraction | int  # a ratio of the context (Fraction) or an absolute token count (int)

#: The most per-layer entries a profile takes (MoE-nD's layers, tables and solver): twice the
#: deepest model in the catalog (126 layers). The greedy solver's time grows as layers squared.
MAX_LAYERS = 256

#: ``add(field, value)``: adds to one ``CompressionWork`` field (kvsim.compression.sizing).
WorkAdder = Callable[[str, float], None]


@dataclass(frozen=True)
class LayerConfig:
    """One KV layer's MoE-nD expert: keep ratio of the prompt, K and V bits (16: unquantised)."""

    keep: Fraction = Fraction(1)
    kbits: int = 16
    vbits: int = 16

    def text(self) -> str:
        return f"{ratio_text(self.keep)}x{self.kbits}x{self.vbits}"


@dataclass(frozen=True)
class Key:
    """One ``key=value`` a profile accepts: kind, default (None: required or derived), help.

    Kinds: ``int`` (≥ 1), ``count`` (≥ 0), ``bits`` (1-16), ``ratio`` (in (0, 1]), ``amount``
    (a ratio with a decimal point or a token count), ``ratios`` ('/'-separated), ``layers``
    (MoE-nD experts) and ``path``.
    """

    kind: str  # int | count | bits | ratio | amount | ratios | path | layers
    default: Any
    help: str


# -- the profile object ------------------------------------------------------------------------
@dataclass(frozen=True)
class Compression:
    """A parsed profile: what it keeps per layer; same configuration, same label and salt.

    Subclasses set the class attributes below and override the hooks their method needs; the
    defaults describe a profile that keeps every token at the base width and adds no work.
    """

    label: str
    salt: int
    params: tuple[tuple[str, Any], ...] = ()
    layer_configs: tuple[LayerConfig, ...] = ()  # per-layer experts (MoE-nD)
    candidates: tuple[Compression, ...] = ()  # what a per-request choice picks among (auto)

    # -- declared by each profile ----------------------------------------------------------
    #: The name ``parse_compression`` knows it by.
    name: ClassVar[str] = ""
    #: One line on what the method does, and the paper its defaults come from.
    summary: ClassVar[str] = ""
    source: ClassVar[str] = ""
    #: The keys it accepts, each with its default and where that default comes from.
    keys: ClassVar[Mapping[str, Key]] = {}
    #: No compression at all: the engine takes its uncompressed path (salt 0, plain pages).
    identity: ClassVar[bool] = False
    #: Fewer tokens than the context stay in GPU memory, or are read per step.
    drops_tokens: ClassVar[bool] = False
    #: Compresses the prompt once after prefill; every generated token is kept.
    prompt_only: ClassVar[bool] = False
    #: The full KV lives in CPU DRAM; the GPU keeps a summary and fetches what it reads.
    offloaded: ClassVar[bool] = False
    #: Picks one of its ``candidates`` per request (the engine asks each candidate instead).
    per_request_choice: ClassVar[bool] = False
    #: Work the profile does that no published figure lets us price (left at 0).
    work_notes: ClassVar[tuple[str, ...]] = ()
    #: Why no published quality number exists for the profile (None: see ``quality_budget``).
    unpublished: ClassVar[str | None] = None
    #: What a budget profile's "no published number" reason adds (after its budget).
    budget_note: ClassVar[str] = ""

    # -- parameters ------------------------------------------------------------------------
    def param(self, key: str) -> Any:
        """The resolved value of one of the profile's keys (defaults filled)."""
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(key)

    @property
    def drops(self) -> bool:
        """Whether a request under it holds fewer pages than its context fills (the engine
        compacts it after prefill); an offloaded profile keeps a summary of every token."""
        return self.drops_tokens and not self.offloaded

    @property
    def linear_reads(self) -> bool:
        """Whether a decode step reads one more token per step of context (none, quant)."""
        return not self.drops_tokens

    # -- what it keeps and reads -----------------------------------------------------------
    @property
    def layer_count(self) -> int | None:
        """KV layers the profile is written for (per-layer lists), or None when uniform."""
        return None

    def layer_count_hint(self, kv_layers: int) -> str:
        """What to give when `layer_count` is not the model's `kv_layers` (for the error)."""
        return f"give {kv_layers} entries, one per KV layer, or a single entry for all layers"

    def keep_ratio(self, layer: int | None) -> Fraction:
        """The prompt fraction a per-layer profile keeps in ``layer`` (None: the mean)."""
        return Fraction(1)

    def keep(self, tokens: int, layer: int | None) -> int:
        """The profile's rule: tokens it keeps of ``tokens`` (the context, or the prompt for a
        prompt-only profile) in one KV head of ``layer``; ``kept_tokens`` caps it."""
        return tokens

    @property
    def exact_tokens(self) -> int:
        """Leading tokens that stay at their positions when the profile drops others."""
        return 0

    def kept_tokens(
        self, context_tokens: int, layer: int | None = None, generated_tokens: int = 0
    ) -> int:
        """Tokens whose KV stays in GPU memory for one KV head of ``layer`` after compression.

        ``layer=None`` answers for the mean over the profile's layers (the same as any layer for
        uniform profiles). An offloaded profile keeps every token's summary on the GPU, so it
        answers ``context_tokens``; see ``bytes_per_kept_token``.
        """
        n, g = check_tokens(context_tokens, generated_tokens)
        if self.prompt_only:
            prompt = n - g
            return min(prompt, self.keep(prompt, layer)) + g
        return min(n, self.keep(n, layer))

    def read_tokens(
        self, context_tokens: int, layer: int | None = None, generated_tokens: int = 0
    ) -> int:
        """Tokens attention reads per decode step: the kept ones unless the profile fetches."""
        return self.kept_tokens(context_tokens, layer, generated_tokens)

    # -- how a kept token is stored ----------------------------------------------------------
    def layer_bits(self, layer: int | None = None) -> tuple[int, int, int] | None:
        """(K bits, V bits, group size) the layer stores, or None for the base KV dtype."""
        return None

    def residual_tokens(self) -> int:
        """Most recent tokens kept unquantised (KIVI's residual), 0 for profiles without one."""
        return 0

    def gpu_token_bytes(self, lb: LayerBytes) -> float:
        """Bytes one kept token costs in GPU memory in the layer ``lb`` (its compressed width)."""
        return lb.token_bytes

    # -- what it costs ---------------------------------------------------------------------
    def add_layer_work(
        self, add: WorkAdder, layer: int, lb: LayerBytes, q_heads: int, key_dims: int
    ) -> None:
        """Add the profile's own work in KV layer ``layer`` (``q_heads`` query heads on the
        rank, ``key_dims`` the key dim or MLA latent) to ``CompressionWork`` fields by ``add``.
        Quantising and dequantising are added for every profile from ``layer_bits``."""

    # -- its quality proxy -----------------------------------------------------------------
    def quality_budget(self) -> tuple[Amount, str] | None:
        """The KV size published points are matched on (tokens per head, or a ratio of the
        context) and how it is made up, or None for a profile matched on its keys alone."""
        return None

    def quality_keys(self) -> dict[str, Any]:
        """Keys a published point must equal where the paper states them (``window``,
        ``bits``, ``group``, ``residual``)."""
        return {}

    def fixed_quality_points(self) -> list[QualityPoint] | None:
        """Points that apply whatever the published tables say (none's definition, MoE-nD's
        abstract), or None to match the tables."""
        return None

    def no_quality_reason(self) -> str | None:
        """Why no published number applies, or None where the budget rule says why."""
        if self.unpublished is None:
            return None
        return f"no published number found for {self.label}: {self.unpublished}"

    # -- parsing ---------------------------------------------------------------------------
    @classmethod
    def parse(cls, rest: str) -> Compression:
        """The profile from the text after ``NAME:`` ('' for none): keys checked, defaults
        filled, then ``resolve``."""
        name = cls.name
        if not cls.keys:
            if rest.strip():
                raise ConfigError(f"compression {name}: takes no keys, got {rest.strip()!r}")
            return cls.build({})
        given = _split_pairs(cls, rest) if rest.strip() else {}
        values = {k: parse_value(name, k, cls.keys[k].kind, v) for k, v in given.items()}
        return cls.resolve(values)

    @classmethod
    def resolve(cls, values: dict[str, Any]) -> Compression:
        """The profile from its parsed values: defaults filled in; a profile with derived or
        related keys overrides this to check and fill them."""
        params = {k: key.default for k, key in cls.keys.items() if key.default is not None}
        params.update(values)
        return cls.build(params)

    @classmethod
    def build(cls, params: dict[str, Any], **extra: Any) -> Compression:
        """The instance with its canonical label (sorted keys, defaults filled) and salt."""
        shown = {k: v for k, v in params.items() if k in cls.keys}
        label = cls.name
        if shown:
            text = ",".join(f"{k}={value_text(cls.keys[k].kind, shown[k])}" for k in sorted(shown))
            label = f"{cls.name}:{text}"
        return cls(
            label=label,
            salt=0 if cls.identity else salt_of(label),
            params=tuple(sorted(shown.items())),
            **extra,
        )


# -- helpers for profile modules -----------------------------------------------------------------
def check_tokens(context_tokens: int, generated_tokens: int) -> tuple[int, int]:
    if context_tokens < 0:
        raise ConfigError(f"context_tokens: must be ≥ 0, got {context_tokens}")
    if not 0 <= generated_tokens <= context_tokens:
        raise ConfigError(
            f"generated_tokens: must be in [0, context_tokens={context_tokens}], "
            f"got {generated_tokens}"
        )
    return context_tokens, generated_tokens


def pick(values: tuple[Any, ...], layer: int, name: str, key: str) -> Any:
    """The ``layer``-th entry of a per-layer list; a one-entry list applies to every layer."""
    if len(values) == 1:
        return values[0]
    if not 0 <= layer < len(values):
        raise ConfigError(
            f"compression {name}: {key} lists {len(values)} layers, no layer {layer}; give one "
            f"entry per KV layer of the model"
        )
    return values[layer]


def amount_tokens(amount: Amount, n: int) -> int:
    """Tokens a budget keeps of ``n``: ``ceil(ratio × n)``, or the token count itself."""
    if isinstance(amount, Fraction):
        return math.ceil(amount * n)
    return amount


def ratio_text(value: Fraction) -> str:
    """Exact decimal text of a ratio parsed from decimal text (its denominator is 2^a·5^b).

    Exact, so the label reads back to the same fraction: ``repr(float)`` would round long inputs.
    """
    digits = 1
    while (value * 10**digits).denominator != 1:
        digits += 1
        if digits > 64:
            raise ValueError(f"{value} has no short decimal form")
    whole = value.numerator * 10**digits // value.denominator
    text = f"{whole // 10**digits}.{whole % 10**digits:0{digits}d}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def amount_text(value: Amount) -> str:
    return ratio_text(value) if isinstance(value, Fraction) else str(value)


def salt_of(label: str) -> int:
    """A stable 62-bit int from the label (blake2b; Python's ``hash`` is salted per process)."""
    digest = hashlib.blake2b(label.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 2) or 1


# -- parsing values ------------------------------------------------------------------------------
def _fail(name: str, key: str, value: str, expected: str) -> ConfigError:
    return ConfigError(f"compression {name}: {key}={value!r}: expected {expected}")


def _parse_int(name: str, key: str, text: str, low: int = 1, high: int | None = None) -> int:
    span = f"an integer ≥ {low}" if high is None else f"an integer {low}-{high}"
    try:
        value = int(text)
    except ValueError:
        raise _fail(name, key, text, span) from None
    if value < low or (high is not None and value > high):
        raise _fail(name, key, text, span)
    return value


_DECIMAL = re.compile(r"(\d+\.?\d*|\.\d+)%?")


def _parse_ratio(name: str, key: str, text: str) -> Fraction:
    what = "a ratio in (0, 1], e.g. 0.2 or 20%"
    if not _DECIMAL.fullmatch(text) or len(text) > 24:
        raise _fail(name, key, text, what)
    value = Fraction(text[:-1]) / 100 if text.endswith("%") else Fraction(text)
    if not 0 < value <= 1:
        raise _fail(name, key, text, what)
    return value


def _parse_amount(name: str, key: str, text: str) -> Amount:
    if "." in text or text.endswith("%"):
        return _parse_ratio(name, key, text)
    try:
        value = int(text)
    except ValueError:
        raise _fail(
            name, key, text, "a ratio with a decimal point (0.2) or a token count (512)"
        ) from None
    if value < 1:
        raise _fail(name, key, text, "a token count ≥ 1 (or a ratio with a decimal point)")
    return value


def _parse_layers(name: str, key: str, text: str) -> tuple[LayerConfig, ...]:
    """``KEEPxKBITSxVBITS[*N]`` entries separated by '/'."""
    what = "entries KEEPxKBITSxVBITS[*N] separated by '/', e.g. 1.0x16x16*4/0.5x4x2*28"
    configs: list[LayerConfig] = []
    for entry in text.split("/"):
        body, _, repeat = entry.partition("*")
        parts = body.split("x")
        if len(parts) != 3:
            raise _fail(name, key, text, what)
        keep = _parse_ratio(name, key, parts[0])
        kbits = _parse_int(name, key, parts[1], 1, 16)
        vbits = _parse_int(name, key, parts[2], 1, 16)
        count = _parse_int(name, key, repeat, 1, MAX_LAYERS) if repeat else 1
        if len(configs) + count > MAX_LAYERS:
            raise _fail(name, key, text, f"at most {MAX_LAYERS} layers in all")
        configs.extend([LayerConfig(keep, kbits, vbits)] * count)
    return tuple(configs)


def _layers_text(configs: tuple[LayerConfig, ...]) -> str:
    """Run-length form of per-layer experts: equal neighbours become ``entry*N``."""
    runs: list[list[Any]] = []
    for cfg in configs:
        if runs and runs[-1][0] == cfg:
            runs[-1][1] += 1
        else:
            runs.append([cfg, 1])
    return "/".join(c.text() + (f"*{n}" if n > 1 else "") for c, n in runs)


def parse_value(name: str, key: str, kind: str, text: str) -> Any:
    """One key's value from its text, by the key's kind; ConfigError naming what was expected."""
    if kind == "int":
        return _parse_int(name, key, text)
    if kind == "count":
        return _parse_int(name, key, text, 0)
    if kind == "bits":
        return _parse_int(name, key, text, 1, 16)
    if kind == "ratio":
        return _parse_ratio(name, key, text)
    if kind == "amount":
        return _parse_amount(name, key, text)
    if kind == "ratios":
        return tuple(_parse_ratio(name, key, part) for part in text.split("/"))
    if kind == "layers":
        return _parse_layers(name, key, text)
    if not text:
        raise _fail(name, key, text, "a file path")
    return text  # path


def value_text(kind: str, value: Any) -> str:
    """A value's canonical text in a label (what ``parse_value`` reads back)."""
    if kind in ("ratio", "amount"):
        return amount_text(value)
    if kind == "ratios":
        return "/".join(ratio_text(v) for v in value)
    if kind == "layers":
        return _layers_text(value)
    return str(value)


def _split_pairs(cls: type[Compression], rest: str) -> dict[str, str]:
    name = cls.name
    valid = ", ".join(sorted(cls.keys)) or "none"
    pairs: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise ConfigError(
                f"compression {name}: {item.strip()!r} is not key=value; valid keys: {valid}"
            )
        if key not in cls.keys:
            raise ConfigError(f"compression {name}: unknown key {key!r}; valid keys: {valid}")
        if key in pairs:
            raise ConfigError(f"compression {name}: key {key!r} given twice")
        pairs[key] = value
    return pairs
