"""The model catalog: one TOML file per model under ``kvsim/catalog/``, or any file of that format.

A file holds the top-level ``ModelSpec`` fields, one ``[[layer_groups]]`` table per attention
shape and one ``[[mlp_groups]]`` table per feed-forward shape; see ``llama-3.1-8b.toml`` for the
plain case and ``deepseek-v3.toml`` / ``jamba-v0.1.toml`` for MLA, MoE and Mamba. Every value
comes from the model's published config.json, named by ``hf_config``. Errors name the file and
the field, because a typo in a data file should be a one-line fix.

``weight_dtype`` (optional, default ``"bf16"``) is the dtype the published weights are served in,
from the same config.json (``torch_dtype``, or ``quantization_config`` where the checkpoint is
quantized: DeepSeek-V3 ships fp8). `kvsim run` and `kvsim size` use it when no
``--weight-dtype`` is given.

``max_context_tokens`` (optional; every catalog file gives it) is the longest sequence, prompt
plus output, the model serves: config.json's ``max_position_embeddings``, or the model card's
figure where the two differ (each file says which and why). A run refuses a longer request, as
vLLM refuses a prompt beyond ``max_model_len``. A file without it sets no limit.
"""

from __future__ import annotations

import functools
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError, UnknownNameError
from kvsim.models.dtypes import WEIGHT_DTYPE_BYTES
from kvsim.models.spec import ATTENTION_KINDS, LayerGroup, MlpGroup, ModelSpec
from kvsim.textio import exists, key_name, parse_toml, read_utf8

_TOP_FIELDS: dict[str, type] = {
    "name": str,
    "hf_config": str,
    "hidden_size": int,
    "num_layers": int,
    "num_attention_heads": int,
    "vocab_size": int,
    "tie_word_embeddings": bool,
    "norms_per_layer": int,
    "weight_dtype": str,
    "max_context_tokens": int,
}
_TOP_OPTIONAL = {"norms_per_layer", "weight_dtype", "max_context_tokens"}
_GROUP_FIELDS: dict[str, type] = {
    "kind": str,
    "layers": int,
    "num_heads": int,
    "num_kv_heads": int,
    "head_dim": int,
    "head_dim_k": int,
    "head_dim_v": int,
    "window": int,
    "attention_bias": bool,
    "kv_sharing_factor": int,
    "q_lora_rank": int,
    "kv_lora_rank": int,
    "qk_rope_head_dim": int,
    "qk_nope_head_dim": int,
    "v_head_dim": int,
    "state_bytes_per_seq": int,
    "state_dtype_bytes": int,
    "mamba_expand": int,
    "mamba_d_state": int,
    "mamba_d_conv": int,
    "mamba_dt_rank": int,
    "mixer_params_per_layer": int,
}
_REQUIRED_BY_KIND: dict[str, tuple[str, ...]] = {
    "full": ("num_heads", "num_kv_heads"),
    "sliding": ("num_heads", "num_kv_heads", "window"),
    "mla": ("num_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"),
    "linear": (),
    "none": (),
}
_MAMBA_FIELDS = ("mamba_expand", "mamba_d_state", "mamba_d_conv", "mamba_dt_rank")
#: Counts and dimensions that are meaningless at 0: a model with no layers, heads or head width
#: has no KV to size, and a 0 here used to pass and then divide by zero or size nothing.
_POSITIVE = {
    "hidden_size", "num_layers", "num_attention_heads", "vocab_size", "max_context_tokens",
    "layers", "num_heads", "num_kv_heads", "head_dim", "head_dim_k", "head_dim_v", "window",
    "kv_sharing_factor", "q_lora_rank", "kv_lora_rank", "v_head_dim", "state_bytes_per_seq",
    "state_dtype_bytes", "mamba_expand", "mamba_d_state", "mamba_d_conv", "mamba_dt_rank",
    "mixer_params_per_layer", "intermediate_size", "shared_intermediate_size",
}  # fmt: skip
#: Largest value of any integer field: far above every real model (vocabularies of ~10^6, hidden
#: sizes of ~10^5), and small enough that sizes and FLOPs derived from it stay finite floats.
MAX_INT_FIELD = 2**31 - 1
_MLP_FIELDS: dict[str, type] = {
    "layers": int,
    "intermediate_size": int,
    "num_experts": int,
    "experts_per_token": int,
    "num_shared_experts": int,
    "shared_intermediate_size": int,
}


def _shown(value: object) -> str:
    """A value in an error message: its repr, cut to 60 characters (a line, not a page)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _catalog_dir() -> Traversable:
    return resources.files("kvsim") / "catalog"


def model_names() -> list[str]:
    """Names ``load_model`` accepts without a path: the catalog files' stems."""
    return sorted(
        entry.name.removesuffix(".toml")
        for entry in _catalog_dir().iterdir()
        if entry.name.endswith(".toml")
    )


def load_model(name_or_path: str) -> ModelSpec:
    """A catalog model by name (``"llama-3.1-70b"``) or a TOML file of the same format."""
    if name_or_path in model_names():
        return _load_catalog(name_or_path)
    path = Path(name_or_path)
    if path.suffix == ".toml" or exists(path):
        if not exists(path):
            raise ConfigError(f"{path}: model file not found")
        return parse_model(read_utf8(path, str(path), ConfigError), str(path))
    raise UnknownNameError("model", name_or_path, model_names())


@functools.cache
def _load_catalog(name: str) -> ModelSpec:
    text = (_catalog_dir() / f"{name}.toml").read_text(encoding="utf-8")
    spec = parse_model(text, f"catalog/{name}.toml")
    if spec.name != name:
        raise ConfigError(f"catalog/{name}.toml: name: {spec.name!r} differs from the file name")
    return spec


def parse_model(text: str, source: str) -> ModelSpec:
    """A ``ModelSpec`` from TOML text; ``source`` names the file in error messages."""
    return _Parser(source).model(parse_toml(text, source, ConfigError, "not valid TOML"))


class _Parser:
    """Checks fields one by one so an error can say which file and which field is wrong."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {field}: {message}")

    def check_table(
        self, table: dict[str, Any], fields: dict[str, type], where: str, required: set[str]
    ) -> None:
        for key, value in table.items():
            name = f"{where}{key_name(key)}"
            if key not in fields:
                raise self.fail(name, f"unknown field; expected one of {', '.join(fields)}")
            expected = fields[key]
            ok = isinstance(value, expected) and not (expected is int and isinstance(value, bool))
            if not ok:
                raise self.fail(name, f"expected {expected.__name__}, got {_shown(value)}")
            if expected is int and value < 0:
                raise self.fail(name, f"must not be negative, got {_shown(value)}")
            if expected is int and value > MAX_INT_FIELD:
                raise self.fail(
                    name, f"must be at most {MAX_INT_FIELD:,} (implausible), got {_shown(value)}"
                )
            if key in _POSITIVE and value < 1:
                raise self.fail(name, f"must be ≥ 1, got {value}")
        for key in fields:
            if key in required and key not in table:
                raise self.fail(f"{where}{key}", "missing")

    def model(self, data: dict[str, Any]) -> ModelSpec:
        top = {k: v for k, v in data.items() if k not in ("layer_groups", "mlp_groups")}
        self.check_table(top, _TOP_FIELDS, "", set(_TOP_FIELDS) - _TOP_OPTIONAL)
        hidden = top["hidden_size"]
        weight_dtype = top.get("weight_dtype", "bf16")
        if weight_dtype not in WEIGHT_DTYPE_BYTES:
            raise self.fail(
                "weight_dtype",
                f"{weight_dtype!r} is not one of {', '.join(WEIGHT_DTYPE_BYTES)}",
            )
        groups = tuple(
            self.layer_group(g, f"layer_groups[{i}].", hidden)
            for i, g in enumerate(self.array(data, "layer_groups"))
        )
        mlps = tuple(
            self.mlp_group(g, f"mlp_groups[{i}].")
            for i, g in enumerate(self.array(data, "mlp_groups"))
        )
        for field, total in (
            ("layer_groups", sum(g.layers for g in groups)),
            ("mlp_groups", sum(m.layers for m in mlps)),
        ):
            if total != top["num_layers"]:
                raise self.fail(
                    field, f"layers add up to {total}, num_layers is {top['num_layers']}"
                )
        return ModelSpec(
            name=top["name"],
            hf_config=top["hf_config"],
            hidden_size=hidden,
            num_layers=top["num_layers"],
            vocab_size=top["vocab_size"],
            num_attention_heads=top["num_attention_heads"],
            tie_word_embeddings=top["tie_word_embeddings"],
            layer_groups=groups,
            mlp_groups=mlps,
            norms_per_layer=top.get("norms_per_layer", 2),
            weight_dtype=weight_dtype,
            max_context_tokens=top.get("max_context_tokens"),
        )

    def array(self, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
        value = data.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(t, dict) for t in value):
            raise self.fail(key, f"expected one or more [[{key}]] tables")
        return value

    def layer_group(self, table: dict[str, Any], where: str, hidden: int) -> LayerGroup:
        self.check_table(table, _GROUP_FIELDS, where, {"kind", "layers"})
        kind = table["kind"]
        if kind not in ATTENTION_KINDS:
            raise self.fail(f"{where}kind", f"{kind!r} is not one of {', '.join(ATTENTION_KINDS)}")
        for key in _REQUIRED_BY_KIND[kind]:
            if key not in table:
                raise self.fail(f"{where}{key}", f"missing (required for kind {kind!r})")
        values = {k: v for k, v in table.items() if k in LayerGroup.__dataclass_fields__}
        if kind in ("full", "sliding"):
            head_dim = table.get("head_dim", hidden // table["num_heads"])
            values.setdefault("head_dim_k", head_dim)
            values.setdefault("head_dim_v", head_dim)
        if kind in ("full", "sliding"):
            heads, kv_heads = table["num_heads"], table["num_kv_heads"]
            if heads % kv_heads:
                raise self.fail(
                    f"{where}num_kv_heads",
                    f"{kv_heads} does not divide num_heads {heads} (each KV head serves a whole "
                    "group of query heads)",
                )
            if values["head_dim_k"] < 1 or values["head_dim_v"] < 1:
                raise self.fail(
                    f"{where}head_dim", f"hidden_size {hidden} / num_heads {heads} is 0; give one"
                )
        if kind == "mla" and table["qk_rope_head_dim"] + table["qk_nope_head_dim"] < 1:
            raise self.fail(f"{where}qk_rope_head_dim", "qk_rope + qk_nope head dims must be ≥ 1")
        if kind == "linear":
            values.update(self.mamba(table, where, hidden))
        return LayerGroup(**values)

    def mamba(self, table: dict[str, Any], where: str, hidden: int) -> dict[str, int]:
        """Mamba-1 state per sequence: conv ``(d_conv − 1) × d_inner`` + SSM ``d_inner × d_state``.

        This is vLLM's Mamba state layout; elements are stored at ``state_dtype_bytes`` (2: the
        model dtype, vLLM's ``mamba_cache_dtype="auto"``). A group may instead give
        ``state_bytes_per_seq`` and ``mixer_params_per_layer`` for other linear-attention mixers.
        """
        if all(k in table for k in ("state_bytes_per_seq", "mixer_params_per_layer")):
            return {}
        for key in _MAMBA_FIELDS:
            if key not in table:
                raise self.fail(
                    f"{where}{key}",
                    "missing (a linear group needs the mamba_* fields, or both "
                    "state_bytes_per_seq and mixer_params_per_layer)",
                )
        d_inner = table["mamba_expand"] * hidden
        d_state, d_conv = table["mamba_d_state"], table["mamba_d_conv"]
        elements = (d_conv - 1) * d_inner + d_inner * d_state
        state = table["layers"] * elements * table.get("state_dtype_bytes", 2)
        return {
            "mamba_d_inner": d_inner,
            "state_bytes_per_seq": table.get("state_bytes_per_seq", state),
        }

    def mlp_group(self, table: dict[str, Any], where: str) -> MlpGroup:
        self.check_table(table, _MLP_FIELDS, where, {"layers", "intermediate_size"})
        if table.get("num_experts", 0) and not table.get("experts_per_token"):
            raise self.fail(f"{where}experts_per_token", "missing (required with num_experts)")
        if table.get("experts_per_token", 0) > table.get("num_experts", 0):
            raise self.fail(f"{where}experts_per_token", "exceeds num_experts")
        return MlpGroup(**table)
