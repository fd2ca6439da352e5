"""Each op's FLOPs and bytes against closed forms worked by hand (and brute-force counts)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

import hwprofiles
from costmodels import ops
from costmodels.roofline import Roof
from costmodels.workload import parse_workload
from hwprofiles.errors import InputError


def test_gemm():
    # [3 tokens, 4] @ [4, 5]: 3*4*5 = 60 multiply-adds = 120 FLOPs
    # bytes: weights 4*5*2 = 40, activations in 3*4*2 = 24, out 3*5*2 = 30 -> 94
    f, b = ops.gemm(3, 4, 5, 2.0, 2.0)
    assert f == 120 and b == 94
    # FP4 weights (0.5625 B) shrink only the weight bytes: 20 * 0.5625 = 11.25
    f, b = ops.gemm(3, 4, 5, 0.5625, 2.0)
    assert f == 120 and b == 11.25 + 54


def test_norm_residual():
    # 2 tokens, h=8: 5*2*8 = 80 FLOPs; 4*2*8*2 = 128 activation bytes + 8*2 weight bytes
    f, b = ops.norm_residual(2, 8, 2.0, 2.0)
    assert f == 80 and b == 144


def _pairs_brute(S, w):
    return sum(1 for i in range(S) for j in range(i + 1) if w == 0 or i - j < w)


@pytest.mark.parametrize("S,w", [(1, 0), (4, 0), (4, 2), (7, 3), (5, 5), (5, 9), (10, 1)])
def test_causal_pairs_brute_force(S, w):
    assert ops.causal_pairs(S, w) == _pairs_brute(S, w)


def test_attention_prefill():
    # 2 seqs of 4 tokens, nq=2, nkv=1, d=8, full: pairs = 10 per head and seq
    # FLOPs = 4*d*nq*pairs*seqs = 4*8*2*10*2 = 1280
    # bytes per seq: 4*(2*2*8 + 2*1*8)*2 [Q,O,K,V at 2 B] = 4*48*2 = 384
    #                + 4*2*1*8*1 [KV cache write at 1 B] = 64  -> 448, x2 seqs = 896
    f, b = ops.attention_prefill(2, 4, 0, 2, 1, 8, 2.0, 1.0)
    assert f == 1280 and b == 896
    # window 2: pairs = 1+2+2+2 = 7; cache keeps 2 tokens
    f, b = ops.attention_prefill(2, 4, 2, 2, 1, 8, 2.0, 1.0)
    assert f == 4 * 8 * 2 * 7 * 2 and b == 2 * (384 + 2 * 2 * 8)


def test_attention_decode():
    # 3 seqs at context 100, nq=4, nkv=2, d=16, KV fp8 (1 B), activations 2 B
    # FLOPs 4*16*4*100*3 = 76800
    # bytes per seq: read cache 2*2*16*100 = 6400 + append 2*2*16 = 64 + q,o 2*4*16*2 = 256
    f, b = ops.attention_decode(3, 100, 0, 4, 2, 16, 2.0, 1.0)
    assert f == 76800 and b == 3 * (6400 + 64 + 256)
    # a sliding window of 10 caps the read at 10 keys
    f, b = ops.attention_decode(3, 100, 10, 4, 2, 16, 2.0, 1.0)
    assert f == 4 * 16 * 4 * 10 * 3 and b == 3 * (2 * 2 * 16 * 11 + 256)


def test_conv():
    # prefill: 2 seqs x 5 tokens, 6 channels, kernel 4
    # FLOPs 2*10*6*4 = 480; bytes 2*10*6*2 (in/out) = 240 + 6*4*2 (weights) = 48
    #       + final state 2*6*3*2 = 72  -> 360
    f, b = ops.conv_prefill(2, 5, 6, 4, 2.0, 2.0, 2.0)
    assert f == 480 and b == 360
    # decode step for 2 seqs: FLOPs 2*2*6*4 = 96; bytes 2*2*6*2 = 48 + 48 + state r+w 2*2*6*3*2 = 144
    f, b = ops.conv_decode(2, 6, 4, 2.0, 2.0, 2.0)
    assert f == 96 and b == 240


def test_ssd():
    # decode: B=2, H=3, P=4, N=5, G=1, act 2 B, state fp32
    # FLOPs 5*2*3*4*5 = 600; bytes 2*(2*60*4 = 480 + (2*12 + 2*5 + 3)*2 = 74) = 1108
    f, b = ops.ssd_decode(2, 3, 4, 5, 1, 2.0, 4.0)
    assert f == 600 and b == 1108
    # prefill: 1 seq, S=256, chunk 128, H=2, P=4, N=8, G=1
    # FLOPs 2*256*128*(8*1 + 4*2) + 4*256*8*4*2 = 1048576 + 65536
    # bytes 256*(2*2*4 + 2*1*8 + 2)*2 + 2*4*8*4 = 256*34*2 + 256
    f, b = ops.ssd_prefill(1, 256, 2, 4, 8, 1, 128, 2.0, 4.0)
    assert f == 1048576 + 65536 and b == 256 * 34 * 2 + 256
    # a prompt shorter than the chunk uses Q = S
    f, _ = ops.ssd_prefill(1, 16, 2, 4, 8, 1, 128, 2.0, 4.0)
    assert f == 2 * 16 * 16 * 16 + 4 * 16 * 8 * 4 * 2


def test_gated_norm_and_activation():
    assert ops.gated_norm(2, 10, 2.0, 2.0) == (160, 2 * 10 * 2 * 3 + 20)
    f, b = ops.activation(2, 10, 1, 2.0)  # SwiGLU
    assert f == 100 and b == 120
    f, b = ops.activation(2, 10, 0, 2.0)  # relu^2
    assert f == 40 and b == 80


def _distinct_brute(E, k, T):
    """Exact expected distinct experts: average over all ways T tokens pick k of E."""
    choices = list(itertools.combinations(range(E), k))
    total = count = 0
    for picks in itertools.product(choices, repeat=T):
        total += len(set().union(*picks))
        count += 1
    return total / count


@pytest.mark.parametrize("E,k,T", [(4, 2, 1), (4, 2, 2), (5, 2, 3), (6, 1, 4), (4, 4, 2)])
def test_expected_experts_matches_enumeration(E, k, T):
    assert ops.expected_experts(E, k, T) == pytest.approx(_distinct_brute(E, k, T))


def test_moe_experts():
    # T=2 tokens, E=4, k=2 -> 3 distinct experts expected; width 8, e_in 16, relu2 (2 mats)
    # FLOPs: 2*(2*2)*2*16*8 = 2048 + activation 2*(2*2)*8 = 64
    # bytes: 3*2*16*8*0.5625 = 432 weights + 4 copies*(2*16 + 2*8)*2 = 384
    f, b = ops.moe_experts(2, 4, 2, 8, 16, 2, 0.5625, 2.0)
    assert f == 2048 + 64 and b == pytest.approx(432 + 384)


def test_embedding_lm_head_allreduce():
    assert ops.embedding(3, 8, 2.0, 2.0) == (0.0, 96)
    f, b = ops.lm_head(2, 8, 100, 2.0, 2.0)
    assert f == 2 * 2 * 8 * 100 and b == 8 * 100 * 2 + 2 * 108 * 2 + 8 * 2 * 100
    # ring all-reduce of 1 MB over 4 GPUs: 2*3/4 * 1e6 / (100e9 * 0.5) + 5 us
    assert ops.allreduce_time(1e6, 4, 100e9, 0.5, 5e-6) == pytest.approx(5e-6 + 1.5e6 / 50e9)
    assert ops.allreduce_time(1e6, 1, 100e9, 0.5, 5e-6) == 0.0


def test_roofline():
    # Roof is what pricing calls: H100 BF16 989e12 FLOP/s x 0.95, HBM 3.35e12 B/s x 0.95,
    # 10 us per kernel
    data = json.loads(hwprofiles.get("h100-sxm").model_dump_json())
    data["efficiency"]["matmul"]["bf16"] = {"points": [[1.0, 0.95]], "source": "test"}
    data["efficiency"]["memory"] = {"points": [[1.0, 0.95]], "source": "test"}
    data["kernel_overhead_s"] = {"value": 1e-5, "source": "test"}
    hw = hwprofiles.HardwareProfile.model_validate(data)
    assert (hw.peak("bf16"), hw.memory_bandwidth.value) == (989e12, 3.35e12)
    roof = Roof(hw)
    inv_c, inv_m = roof.matmul("bf16", 1e12), roof.memory(1e9)
    assert inv_c == pytest.approx(1 / (989e12 * 0.95)) and inv_m == pytest.approx(1 / 3.1825e12)
    # compute-bound: 1e12 FLOPs -> 1.0644 ms beats 1e9 bytes -> 0.3142 ms; + 2 kernels x 10 us
    t = roof.time(np.array([1e12, 1e9, 0.0]), np.array([1e9, 1e9, 0.0]), inv_c, inv_m, 2)
    assert t == pytest.approx([1e12 / 939.55e12 + 2e-5, 1e9 / 3.1825e12 + 2e-5, 2e-5])
    # a measured memory curve is read at each op's size (halfway in log size -> 0.5)
    data["efficiency"]["memory"] = {"points": [[1e6, 0.2], [1e9, 0.8]], "source": "measured on x"}
    curved = Roof(hwprofiles.HardwareProfile.model_validate(data))
    per_byte = curved.memory(np.array([1e3, 10 ** 7.5, 1e12]))
    assert per_byte == pytest.approx(1 / (3.35e12 * np.array([0.2, 0.5, 0.8])))


def test_workload_parse():
    w = parse_workload("isl=8192,osl=1024,batch=64")
    assert (w.isl, w.osl, w.sequences, w.prefill_sequences, w.prefill_chunks) == (8192, 1024, 64, 64, 1)
    c = parse_workload("isl=128, osl=16, concurrency=8, name=chat")
    assert (c.name, c.sequences, c.prefill_sequences, c.prefill_chunks) == ("chat", 8, 8, 1)
    # 8 prompts of 8192 tokens in chunks of the default 8192-token budget: 8 steps
    long = parse_workload("isl=8192,osl=16,concurrency=8")
    assert (long.prefill_chunks, long.chunk_tokens) == (8, 8192)
    capped = parse_workload("isl=100,osl=16,concurrency=5000,max_num_seqs=256,tokens=1000")
    assert (capped.sequences, capped.prefill_chunks) == (256, 25.6)
    assert c.mean_decode_context == 136 and c.max_context == 144
    for bad in ("isl=1,osl=1", "isl=1,osl=1,batch=2,concurrency=2", "isl=1,osl=1,batch=0",
                "isl=1,osl=1,bs=x", "isl=1,foo=2,batch=1", "isl 1"):
        with pytest.raises(InputError) as exc:
            parse_workload(bad)
        assert "\n" not in str(exc.value)
