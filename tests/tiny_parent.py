"""A small hybrid parent (attention, FFN, Mamba, MoE) trained on real English text: shared
by the builder and scoring tests through the session fixture ``trained_parent``."""

from __future__ import annotations

import importlib
import inspect
import warnings

from nas.arch import FFN, Attention, Mamba, ModelArch, MoE


def english_bytes() -> bytes:
    """Docstrings of stdlib modules: real English prose, always installed."""
    docs: list[str] = []
    for name in ["argparse", "collections", "json", "re", "subprocess", "typing", "inspect",
                 "textwrap", "logging", "functools", "itertools", "pathlib", "unittest",
                 "dataclasses", "email", "threading", "decimal", "statistics", "random",
                 "shutil", "tempfile", "zipfile", "csv", "datetime", "heapq", "contextlib"]:
        mod = importlib.import_module(name)
        for obj in [mod] + [getattr(mod, a) for a in dir(mod) if not a.startswith("_")]:
            if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isfunction(obj):
                with warnings.catch_warnings():  # typing.io / typing.re deprecations
                    warnings.simplefilter("ignore", DeprecationWarning)
                    d = inspect.getdoc(obj)
                if d and d not in docs:
                    docs.append(d)
    return "\n\n".join(docs).encode("ascii", "ignore")


PARENT = ModelArch(hidden_size=64, vocab_size=256, blocks=(
    Attention(num_heads=4, num_kv_heads=4, head_dim=16),
    FFN(width=256),
    Mamba(num_heads=8, head_dim=16, state_size=16, n_groups=2),
    MoE(num_experts=8, top_k=2, expert_width=64, shared_width=64),
    Attention(num_heads=4, num_kv_heads=2, head_dim=16),
    MoE(num_experts=8, top_k=4, expert_width=64, shared_width=64, latent_size=32, gated=False,
        activation="relu2", router="sigmoid", router_bias=True, routed_scaling=2.0),
    FFN(width=256),
))
SEQ = 64


def train_parent():  # type: ignore[no-untyped-def]
    """``(model, calib, held, data)``: PARENT trained 120 AdamW steps on 90 % of the text;
    ``calib`` (32 x SEQ) from the training part, ``held`` (16 x SEQ) from the held-out
    10 %, ``data`` the whole byte stream."""
    import torch

    from nas.build import build_model

    data = torch.tensor(list(english_bytes()), dtype=torch.long)
    assert len(data) > 100_000
    cut = int(len(data) * 0.9)
    train, held = data[:cut], data[cut:]
    model = build_model(PARENT, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(120):
        ix = torch.randint(0, len(train) - SEQ - 1, (16,), generator=g).tolist()
        x = torch.stack([train[i:i + SEQ] for i in ix])
        y = torch.stack([train[i + 1:i + SEQ + 1] for i in ix])
        loss = torch.nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    assert sum(losses[-10:]) / 10 < 3.3 < losses[0]  # it learned something about English
    calib = torch.stack([train[i * SEQ:(i + 1) * SEQ] for i in range(32)])
    held_x = torch.stack([held[i * SEQ:(i + 1) * SEQ] for i in range(16)])
    return model, calib, held_x, data
