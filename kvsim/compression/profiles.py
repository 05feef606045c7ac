"""Compression profiles: what each keeps of a request's KV, parsed from ``NAME[:key=value,…]``.

A ``Compression`` answers, per KV layer, how many tokens stay in GPU memory (``kept_tokens``), how
many attention reads per decode step (``read_tokens``) and at which bit widths K and V are stored
(``layer_bits``). Byte sizes live in ``kvsim.compression.sizing``; the profiles themselves know no
model, so one parsed profile serves every model.

Token counts: ``context_tokens`` is the whole sequence so far; ``generated_tokens`` the part the
model produced (0 during and right after prefill). Profiles that compress the *prompt* once after
prefill (SnapKV, LKV, MoE-nD) keep every generated token (SnapKV: memory per head = k + w +
generated, shared/reference/algorithms.md); profiles that hold a cache budget throughout
(StreamingLLM, H2O, KVP) apply their rule to the whole context.

Each profile declares its keys, defaults and the source of each default in ``PROFILES`` (STYLE.md
habit 8). Ratios are exact fractions parsed from the decimal text, so ``ceil(0.15 × 100)`` is 15,
not the 16 that binary floating point gives.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from kvsim.errors import ConfigError, UnknownNameError

__all__ = [
    "PROFILES",
    "Compression",
    "Key",
    "LayerConfig",
    "Profile",
    "parse_compression",
]

Amount = Fraction | int  # a ratio of the context (Fraction) or an absolute token count (int)


@dataclass(frozen=True)
class LayerConfig:
    """One KV layer's MoE-nD expert: keep ratio of the prompt, K and V bits (16: unquantised)."""

    keep: Fraction = Fraction(1)
    kbits: int = 16
    vbits: int = 16

    def text(self) -> str:
        return f"{_ratio_text(self.keep)}x{self.kbits}x{self.vbits}"


@dataclass(frozen=True)
class Key:
    """One ``key=value`` a profile accepts: kind, default (None: required or derived), help."""

    kind: str  # int | count | bits | ratio | amount | ratios | path | layers
    default: Any
    help: str


@dataclass(frozen=True)
class Profile:
    """A compression method: its keys, whether it drops tokens, and where its defaults come from."""

    name: str
    summary: str
    source: str
    keys: Mapping[str, Key] = field(default_factory=dict)
    drops_tokens: bool = False
    prompt_only: bool = False  # compresses the prompt once; generated tokens are all kept


def _ratio_text(value: Fraction) -> str:
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


def _amount_text(value: Amount) -> str:
    return _ratio_text(value) if isinstance(value, Fraction) else str(value)


# -- the profiles ----------------------------------------------------------------------------------
_QUANT_KEYS = {
    "k": Key("bits", 4, "K bits per element (1-16; 16 stores K unquantised)."),
    "v": Key("bits", 4, "V bits per element (1-16)."),
    "group": Key(
        "int",
        32,
        "Elements per quantisation group; each group stores an fp16 scale and an fp16 zero-point "
        "(KIVI, arXiv 2402.02750: G = 32 in its main experiments).",
    ),
    "residual": Key(
        "count",
        128,
        "Most recent tokens kept unquantised at the base KV dtype (KIVI's residual R = 128).",
    ),
}

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("none", "no compression", "-"),
        Profile(
            "streaming",
            "attention sinks plus a rolling window of recent tokens; constant memory",
            "StreamingLLM, Xiao et al., arXiv 2309.17453",
            {
                "sinks": Key("int", 4, "Initial 'attention sink' tokens kept (StreamingLLM: 4)."),
                "window": Key(
                    "int",
                    2000,
                    "Recent tokens kept (StreamingLLM's examples/run_streaming_llama.py: "
                    "recent_size 2000).",
                ),
            },
            drops_tokens=True,
        ),
        Profile(
            "h2o",
            "heavy hitters (accumulated attention) plus recent tokens under a cache budget",
            "H2O, Zhang et al., arXiv 2306.14048",
            {
                "budget": Key(
                    "amount",
                    Fraction(1, 5),
                    "Cache budget: a ratio of the context (with a decimal point) or tokens "
                    "(an integer); H2O's headline budget is 20 %.",
                ),
                "recent": Key(
                    "amount",
                    None,
                    "Recent-window part of the budget (default: half of it, H2O's equal split of "
                    "heavy-hitter and recent tokens); it changes quality, not bytes.",
                ),
            },
            drops_tokens=True,
        ),
        Profile(
            "snapkv",
            "an observation window votes after prefill; top-k prompt tokens per head kept",
            "SnapKV, Li et al., arXiv 2404.14469",
            {
                "window": Key(
                    "int", 32, "Observation window w at the end of the prompt (SnapKV: 32)."
                ),
                "capacity": Key(
                    "int",
                    2048,
                    "Prompt tokens kept per head, k + w (SnapKV's 'KV size'; its LongBench runs "
                    "use 1024, 2048 and 4096; the reference snapkv_utils.py defaults to 2048).",
                ),
            },
            drops_tokens=True,
            prompt_only=True,
        ),
        Profile(
            "lkv",
            "learned per-head budgets; a retention ratio per layer (one ratio or a list)",
            "LKV, Zhou et al., arXiv 2605.06676",
            {
                "ratio": Key(
                    "ratios",
                    (Fraction(3, 20),),
                    "Retention ratio of the prompt: one for every layer, or one per KV layer "
                    "separated by '/' (LKV: near-lossless on LongBench at 15 %).",
                ),
            },
            drops_tokens=True,
            prompt_only=True,
        ),
        Profile(
            "kvp",
            "per-head learned ranking from K and V; nested kept sets across budgets",
            "KVP, Moschella et al., arXiv 2602.10238",
            {
                "budget": Key(
                    "amount",
                    Fraction(1, 5),
                    "Cache budget: a ratio of the context or tokens (our default 20 %, the same as "
                    "H2O's; not a KVP figure).",
                ),
            },
            drops_tokens=True,
        ),
        Profile(
            "quant",
            "grouped asymmetric quantisation of K and V, recent tokens unquantised",
            "KIVI, Liu et al., arXiv 2402.02750",
            _QUANT_KEYS,
        ),
        Profile(
            "moe-nd",
            "per-layer (keep ratio, K bits, V bits) from a table or the greedy solver",
            "MoE-nD, Sun et al., arXiv 2604.17695",
            {
                "table": Key("path", None, "TOML or CSV file of per-layer keep, kbits, vbits."),
                "budget": Key(
                    "ratio",
                    None,
                    "Run the greedy solver for this fraction of the 16-bit KV bytes.",
                ),
                "sensitivity": Key(
                    "path",
                    None,
                    "Per-layer sensitivity table for the solver (TOML or CSV); default: the "
                    "synthetic example table (our assumption, not the paper's).",
                ),
                "n_layers": Key(
                    "int", 32, "Layers of the synthetic sensitivity table (without sensitivity=)."
                ),
                "layers": Key(
                    "layers",
                    None,
                    "Per-layer experts KEEPxKBITSxVBITS separated by '/', '*N' repeats "
                    "(the canonical form table= and budget= resolve to).",
                ),
                "group": Key(
                    "int", 32, "Elements per quantisation group (fp16 scale + zero each), as quant."
                ),
            },
            drops_tokens=True,
            prompt_only=True,
        ),
        Profile(
            "infinigen",
            "KV offloaded to CPU DRAM; each layer fetches only the tokens a partial QK speculates",
            "InfiniGen, Lee et al., arXiv 2406.19707",
            {
                "budget": Key(
                    "ratio",
                    Fraction(1, 5),
                    "Fraction of the context each layer fetches per decode step: the budget 0.2 "
                    "of InfiniGen's artifact example (accuracy/README.md); InfiniGen itself "
                    "fetches what an attention-score threshold selects, at most this budget.",
                ),
                "partial": Key(
                    "ratio",
                    Fraction(1, 5),
                    "Fraction of the key dims kept as the GPU-resident partial keys for "
                    "speculation (partial_weight_ratio 0.2 in the same artifact example).",
                ),
            },
            drops_tokens=True,
        ),
        Profile(
            "auto",
            "MetaKV-style: one of several candidate profiles per request under latency and "
            "memory budgets",
            "reconstruction (see docs/compression.md)",
        ),
    )
}


# -- the compression object ------------------------------------------------------------------------
@dataclass(frozen=True)
class Compression:
    """A parsed profile: what it keeps per layer; same configuration, same label and salt."""

    name: str
    label: str
    salt: int
    drops_tokens: bool
    params: tuple[tuple[str, Any], ...] = ()
    layer_configs: tuple[LayerConfig, ...] = ()
    candidates: tuple[Compression, ...] = ()
    offloaded: bool = False  # infinigen: the full KV lives in CPU DRAM

    def param(self, key: str) -> Any:
        """The resolved value of one of the profile's keys (defaults filled)."""
        for k, v in self.params:
            if k == key:
                return v
        raise KeyError(key)

    @property
    def prompt_only(self) -> bool:
        return PROFILES[self.name].prompt_only

    @property
    def layer_count(self) -> int | None:
        """KV layers the profile is written for (per-layer lists), or None when uniform."""
        if self.name == "moe-nd":
            return len(self.layer_configs)
        if self.name == "lkv" and len(self.param("ratio")) > 1:
            return len(self.param("ratio"))
        return None

    def layer_bits(self, layer: int | None = None) -> tuple[int, int, int] | None:
        """(K bits, V bits, group size) the layer stores, or None for the base KV dtype."""
        if self.name == "quant":
            return self.param("k"), self.param("v"), self.param("group")
        if self.name == "moe-nd":
            cfg = self._layer_config(0 if layer is None else layer)
            if cfg.kbits >= 16 and cfg.vbits >= 16:
                return None
            return cfg.kbits, cfg.vbits, self.param("group")
        return None

    def residual_tokens(self) -> int:
        """Most recent tokens kept unquantised (KIVI's residual), 0 for profiles without one."""
        return self.param("residual") if self.name == "quant" else 0

    def _layer_config(self, layer: int) -> LayerConfig:
        return _pick(self.layer_configs, layer, self.name, "layers")

    def _keep_ratio(self, layer: int | None) -> Fraction:
        """The prompt fraction a per-layer profile keeps (the mean over layers for None)."""
        if self.name == "lkv":
            ratios: tuple[Fraction, ...] = self.param("ratio")
        else:
            ratios = tuple(c.keep for c in self.layer_configs)
        if layer is None:
            return sum(ratios, Fraction(0)) / len(ratios)
        return _pick(ratios, layer, self.name, "ratio")

    def kept_tokens(
        self, context_tokens: int, layer: int | None = None, generated_tokens: int = 0
    ) -> int:
        """Tokens whose KV stays in GPU memory for one KV head of ``layer`` after compression.

        ``layer=None`` answers for the mean over the profile's layers (the same as any layer for
        uniform profiles). Infinigen keeps every token's *partial key* on the GPU (its full KV is
        in CPU DRAM), so it answers ``context_tokens``; see ``bytes_per_kept_token``.
        """
        n, g = _check_tokens(context_tokens, generated_tokens)
        if self.name == "auto":
            return max(c.kept_tokens(n, layer, g) for c in self.candidates)
        rule = _KEEP_RULES.get(self.name)
        if rule is None:
            return n
        if self.prompt_only:
            prompt = n - g
            return min(prompt, rule(self, prompt, layer)) + g
        return min(n, rule(self, n, layer))

    def read_tokens(
        self, context_tokens: int, layer: int | None = None, generated_tokens: int = 0
    ) -> int:
        """Tokens attention reads per decode step: the kept ones, except infinigen's budget."""
        n, g = _check_tokens(context_tokens, generated_tokens)
        if self.name == "infinigen":
            return min(n, math.ceil(self.param("budget") * n))
        if self.name == "auto":
            return max(c.read_tokens(n, layer, g) for c in self.candidates)
        return self.kept_tokens(n, layer, g)


def _check_tokens(context_tokens: int, generated_tokens: int) -> tuple[int, int]:
    if context_tokens < 0:
        raise ConfigError(f"context_tokens: must be ≥ 0, got {context_tokens}")
    if not 0 <= generated_tokens <= context_tokens:
        raise ConfigError(
            f"generated_tokens: must be in [0, context_tokens={context_tokens}], "
            f"got {generated_tokens}"
        )
    return context_tokens, generated_tokens


def _pick(values: tuple[Any, ...], layer: int, name: str, key: str) -> Any:
    """The ``layer``-th entry of a per-layer list; a one-entry list applies to every layer."""
    if len(values) == 1:
        return values[0]
    if not 0 <= layer < len(values):
        raise ConfigError(
            f"compression {name}: {key} lists {len(values)} layers, no layer {layer}; give one "
            f"entry per KV layer of the model"
        )
    return values[layer]


def _amount_tokens(amount: Amount, n: int) -> int:
    if isinstance(amount, Fraction):
        return math.ceil(amount * n)
    return amount


_KEEP_RULES: dict[str, Callable[[Compression, int, int | None], int]] = {
    "streaming": lambda c, n, _l: c.param("sinks") + c.param("window"),
    "h2o": lambda c, n, _l: _amount_tokens(c.param("budget"), n),
    "kvp": lambda c, n, _l: _amount_tokens(c.param("budget"), n),
    "snapkv": lambda c, n, _l: c.param("capacity"),
    "lkv": lambda c, n, layer: math.ceil(c._keep_ratio(layer) * n),
    "moe-nd": lambda c, n, layer: math.ceil(c._keep_ratio(layer) * n),
}


# -- parsing ---------------------------------------------------------------------------------------
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
        count = _parse_int(name, key, repeat) if repeat else 1
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


def _parse_value(name: str, key: str, kind: str, text: str) -> Any:
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


def _value_text(kind: str, value: Any) -> str:
    if kind in ("ratio", "amount"):
        return _amount_text(value)
    if kind == "ratios":
        return "/".join(_ratio_text(v) for v in value)
    if kind == "layers":
        return _layers_text(value)
    return str(value)


def _salt(label: str) -> int:
    """A stable 62-bit int from the label (blake2b; Python's ``hash`` is salted per process)."""
    digest = hashlib.blake2b(label.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 2) or 1


def _make(name: str, params: dict[str, Any], **extra: Any) -> Compression:
    profile = PROFILES[name]
    shown = {k: v for k, v in params.items() if k in profile.keys}
    label = name
    if shown:
        text = ",".join(f"{k}={_value_text(profile.keys[k].kind, shown[k])}" for k in sorted(shown))
        label = f"{name}:{text}"
    return Compression(
        name=name,
        label=label,
        salt=0 if name == "none" else _salt(label),
        drops_tokens=profile.drops_tokens,
        params=tuple(sorted(shown.items())),
        **extra,
    )


def _split_pairs(name: str, rest: str) -> dict[str, str]:
    profile = PROFILES[name]
    valid = ", ".join(sorted(profile.keys)) or "none"
    pairs: dict[str, str] = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key:
            raise ConfigError(
                f"compression {name}: {item.strip()!r} is not key=value; valid keys: {valid}"
            )
        if key not in profile.keys:
            raise ConfigError(f"compression {name}: unknown key {key!r}; valid keys: {valid}")
        if key in pairs:
            raise ConfigError(f"compression {name}: key {key!r} given twice")
        pairs[key] = value
    return pairs


def parse_compression(text: str) -> Compression:
    """``NAME[:key=value,…]`` → ``Compression``; ConfigError naming the bad key or value.

    ``auto`` takes candidate profiles separated by '|': ``auto:none|quant:k=4,v=4|h2o``; plain
    ``auto`` uses ``DEFAULT_AUTO_CANDIDATES``.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"compression: expected NAME[:key=value,...], got {text!r}")
    name, colon, rest = text.strip().partition(":")
    name = name.strip()
    if name not in PROFILES:
        raise UnknownNameError("compression profile", name, list(PROFILES))
    if name == "auto":
        return _parse_auto(rest if colon else "")
    if name == "none":
        if rest.strip():
            raise ConfigError(f"compression none: takes no keys, got {rest.strip()!r}")
        return _make("none", {})
    given = _split_pairs(name, rest) if rest.strip() else {}
    profile = PROFILES[name]
    values = {k: _parse_value(name, k, profile.keys[k].kind, v) for k, v in given.items()}
    return _RESOLVE.get(name, _resolve_plain)(name, values)


def _resolve_plain(name: str, values: dict[str, Any]) -> Compression:
    profile = PROFILES[name]
    params = {k: key.default for k, key in profile.keys.items() if key.default is not None}
    params.update(values)
    return _make(name, params)


def _resolve_h2o(name: str, values: dict[str, Any]) -> Compression:
    budget = values.get("budget", PROFILES[name].keys["budget"].default)
    recent = values.get("recent")
    if recent is None:
        recent = budget / 2 if isinstance(budget, Fraction) else max(1, budget // 2)
    if type(recent) is type(budget) and recent > budget:
        raise ConfigError(
            f"compression h2o: recent={_amount_text(recent)} exceeds budget="
            f"{_amount_text(budget)}; the recent window is part of the budget"
        )
    return _make(name, {"budget": budget, "recent": recent})


def _resolve_snapkv(name: str, values: dict[str, Any]) -> Compression:
    params = {"window": 32, "capacity": 2048, **values}
    if params["capacity"] <= params["window"]:
        raise ConfigError(
            f"compression snapkv: capacity={params['capacity']} must exceed window="
            f"{params['window']} (capacity = top-k + window)"
        )
    return _make(name, params)


def _resolve_infinigen(name: str, values: dict[str, Any]) -> Compression:
    base = _resolve_plain(name, values)
    return Compression(**{**base.__dict__, "offloaded": True})


def _resolve_moe_nd(name: str, values: dict[str, Any]) -> Compression:
    from kvsim.compression.solver import (
        load_layer_table,
        load_sensitivity,
        solve,
        synthetic_sensitivity,
    )

    sources = [k for k in ("table", "budget", "layers") if k in values]
    if len(sources) != 1:
        raise ConfigError(
            "compression moe-nd: give exactly one of table=PATH, budget=RATIO (solver) or "
            f"layers=…; got {', '.join(sources) or 'none of them'}"
        )
    if "sensitivity" in values and "budget" not in values:
        raise ConfigError("compression moe-nd: sensitivity= is read only with budget=")
    if "n_layers" in values and ("budget" not in values or "sensitivity" in values):
        raise ConfigError(
            "compression moe-nd: n_layers= sizes the synthetic table: give it with budget= "
            "and without sensitivity="
        )
    group = values.get("group", 32)
    if "layers" in values:
        configs = values["layers"]
    elif "table" in values:
        configs = load_layer_table(values["table"])
    else:
        if "sensitivity" in values:
            table = load_sensitivity(values["sensitivity"])
        else:
            table = synthetic_sensitivity(values.get("n_layers", 32))
        configs = solve(table, values["budget"], group).configs
    return _make(name, {"layers": configs, "group": group}, layer_configs=configs)


_RESOLVE: dict[str, Callable[[str, dict[str, Any]], Compression]] = {
    "h2o": _resolve_h2o,
    "snapkv": _resolve_snapkv,
    "moe-nd": _resolve_moe_nd,
    "infinigen": _resolve_infinigen,
}


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


def _parse_auto(rest: str) -> Compression:
    texts = [t.strip() for t in rest.split("|")] if rest.strip() else list(DEFAULT_AUTO_CANDIDATES)
    candidates: list[Compression] = []
    for t in texts:
        if t.split(":", 1)[0].strip() == "auto":
            raise ConfigError("compression auto: a candidate cannot itself be auto")
        cand = parse_compression(t)
        if cand.label not in {c.label for c in candidates}:
            candidates.append(cand)
    label = "auto:" + "|".join(c.label for c in candidates)
    return Compression(
        name="auto",
        label=label,
        salt=_salt(label),
        drops_tokens=any(c.drops_tokens for c in candidates),
        candidates=tuple(candidates),
    )
