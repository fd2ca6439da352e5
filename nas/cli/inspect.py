"""``puzzle-nas inspect CONFIG``: parameters, weight bytes, KV and state sizes (CONFIG: a
``config.json``, a folder holding one, or a ``.gguf`` file, read by :mod:`nas.hf.gguf`)."""

from __future__ import annotations

import argparse
import json
import sys

from hwprofiles.units import gb_gib


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="parameter counts and memory of an HF config.json",
                       description="Exact total/active parameters, a per-kind breakdown, weight "
                       "bytes under a precision recipe, KV bytes per token and SSM state bytes "
                       "per sequence of an HF config.json.")
    p.add_argument("config", help="HF config.json (or a folder holding one, or a .gguf "
                   "file: gguf extra)")
    p.add_argument("--precision", default="bf16",
                   help="recipe name (bf16, fp8, nvfp4) or a recipe JSON file (default bf16)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def _b(n: float) -> str:
    return f"{n / 1e9:,.3f} B"


def run(args: argparse.Namespace) -> int:
    from costmodels.dtypes import get_recipe
    from nas.hf import load_config
    from nas.hf.gguf import is_gguf, read_info

    arch = load_config(args.config)
    if is_gguf(args.config):
        info = read_info(args.config)
        print(f"{args.config}: GGUF ({info.quant}), architecture {info.architecture!r}: config "
              "read by transformers from its metadata, no weights loaded (commands that load "
              "them dequantize them to float32)", file=sys.stderr)
    recipe = get_recipe(args.precision)
    s = arch.summary(recipe)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"{args.config}: {s['model_type']}, {s['num_blocks']} blocks "
          + ", ".join(f"{n} {k}" for k, n in s["blocks_by_kind"].items()))
    print(f"  total parameters   {s['total_params']:>18,}  ({_b(s['total_params'])})")
    print(f"  active parameters  {s['active_params']:>18,}  ({_b(s['active_params'])})")
    # the same parts left out of both figures, so they compare (total >= active); the
    # published "active without embeddings" keeps the LM head (it runs every token)
    body_active = s["active_params_without_embeddings"] - s["lm_head_params"]
    print(f"    without embedding table and LM head: total "
          f"{_b(s['total_params_without_embeddings'])}, active {_b(body_active)}")
    print(f"    active without the embedding table only (LM head kept, as published): "
          f"{_b(s['active_params_without_embeddings'])}")
    print(f"  embeddings {s['embedding_params']:,}, LM head {s['lm_head_params']:,}")
    if s["mtp_params"]:
        print(f"  MTP (not in totals) {s['mtp_params']:,}")
    print("  per kind (total / active):")
    for k, n in s["params_by_kind"].items():
        print(f"    {k:<10} {n:>18,} / {s['active_params_by_kind'][k]:,}")
    print(f"  weights under {recipe.name}: {gb_gib(s['weight_bytes'], 2)}")
    for role, n in s["weight_bytes_by_role"].items():
        print(f"    {role:<15} {gb_gib(n, 2)}")
    print(f"  KV cache per token: {s['kv_bytes_per_token']:,.0f} bytes ({recipe.kv_cache.value})")
    print(f"  SSM+conv state per sequence: {s['state_bytes_per_sequence']:,.0f} bytes "
          f"({gb_gib(s['state_bytes_per_sequence'], 2)})")
    return 0
