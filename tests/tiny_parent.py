"""A small hybrid parent (attention, FFN, Mamba, MoE) trained on real English text: shared
by the builder and scoring tests through the session fixture ``trained_parent``.

Both the text and the trained weights are files in ``tests/data`` checked by digest, so
every machine tests the same parent bit for bit. The weights are frozen too because
training does not reproduce across CPUs: the same 120 steps on the same bytes with the
same seed reach held-out losses 2.630 / 2.679 / 2.633 nats under torch's AVX-512 / AVX2 /
scalar kernels (``ATEN_CPU_CAPABILITY``), and 2.34-2.85 over seeds 0-11; top-k routing
and a high learning rate turn rounding differences into a different model.
``tests/test_tiny_parent.py`` retrains and checks the held-out loss within a tolerance."""

from __future__ import annotations

import hashlib
from pathlib import Path

from nas.arch import FFN, Attention, Mamba, ModelArch, MoE

DATA = Path(__file__).resolve().parent / "data"
CORPUS = DATA / "english.txt"
CORPUS_SHA256 = "091ddcbcdaca2890ef047d1e2449366a022f06dab1c5403290ff34137ebd99c3"
FROZEN = DATA / "tiny-parent"  # train_parent(0) as saved by nas.child.save_pretrained
FROZEN_SHA256 = {
    "config.json": "e65976f915c2d0cff7a6e49f276037a586a7927d94bc7d74bd5a7cb0b4162e6a",
    "model.safetensors": "4430a8a1713f91f4cb4a016ac61e488a5dfa85aafc0eb0da5e5af6e138780462",
}
FROZEN_HELD_LOSS = 2.629824843304508  # held_out_loss(frozen, held) when it was trained


def _check(path: Path, want: str) -> bytes:
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != want:
        raise RuntimeError(f"{path}: sha256 {digest}, expected {want} "
                           "(a frozen test input was changed; restore it from git)")
    return data


def english_bytes() -> bytes:
    """The frozen training text: docstrings of 26 stdlib modules of CPython 3.11.7, ASCII,
    189,471 bytes (``tests/data/english.txt``; ``tests/data/README.md`` says how it was
    made). A file, not gathered at run time: what ``dir(module)`` sees depends on what the
    process imported before, so gathered text changed with import order and machine."""
    return _check(CORPUS, CORPUS_SHA256)


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


def train_parent(seed: int = 0):  # type: ignore[no-untyped-def]
    """``(model, calib, held, data)``: PARENT trained 120 AdamW steps on 90 % of the text
    (``seed`` for the initial weights and the batches; the shared fixture uses 0);
    ``calib`` (32 x SEQ) from the training part, ``held`` (16 x SEQ) from the held-out
    10 %, ``data`` the whole byte stream."""
    import torch

    from nas.child import build_model

    data = torch.tensor(list(english_bytes()), dtype=torch.long)
    assert len(data) > 100_000
    train = data[:int(len(data) * 0.9)]
    model = build_model(PARENT, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-3, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
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
    return (model, *_splits(data))


def _splits(data):  # type: ignore[no-untyped-def]
    """``(calib, held, data)``: 32 x SEQ calibration ids from the start of the training 90 %,
    16 x SEQ held-out ids from the start of the last 10 %."""
    import torch

    cut = int(len(data) * 0.9)
    train, held = data[:cut], data[cut:]
    calib = torch.stack([train[i * SEQ:(i + 1) * SEQ] for i in range(32)])
    held_x = torch.stack([held[i * SEQ:(i + 1) * SEQ] for i in range(16)])
    return calib, held_x, data


def frozen_parent():  # type: ignore[no-untyped-def]
    """``(model, calib, held, data)`` as :func:`train_parent` returns them, the model read
    from the frozen checkpoint (``tests/data/tiny-parent``, digests checked) instead of
    trained: the same parent on every machine."""
    import torch

    from nas.child import build_model, load_pretrained

    for name, want in FROZEN_SHA256.items():
        _check(FROZEN / name, want)
    data = torch.tensor(list(english_bytes()), dtype=torch.long)
    # the weights into a model of PARENT itself: the checkpoint's config says model_type
    # nemotron_h_puzzle and spells out Mamba's default time-step limits, the same numerics
    model = build_model(PARENT, seed=0)
    model.load_state_dict(load_pretrained(FROZEN).state_dict(), strict=True)
    return (model.eval(), *_splits(data))


def held_out_loss(model, held) -> float:  # type: ignore[no-untyped-def]
    """Mean next-byte cross-entropy (nats, float64 log-softmax) of ``model`` on ``held``."""
    import torch

    with torch.no_grad():
        logp = torch.log_softmax(model(held)[:, :-1].double(), -1)
    return float(-logp.gather(-1, held[:, 1:, None]).mean())
