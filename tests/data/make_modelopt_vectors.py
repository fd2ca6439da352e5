"""Writes ``modelopt_vectors.safetensors``: weights quantized and dequantized by NVIDIA's
ModelOpt itself (``nvidia-modelopt`` 0.47.0, CPU, ``NVFP4QTensor`` and ``FP8QTensor`` of
``modelopt.torch.quantization.qtensor``), so that the suite checks ``nas.child.formats.modelopt``
against ModelOpt's own results on machines without ModelOpt. Run once by hand::

    pip install torch==2.13.0 safetensors && pip install --no-deps nvidia-modelopt==0.47.0
    python tests/data/make_modelopt_vectors.py   # (and ModelOpt's import-time packages)
"""

from pathlib import Path

import torch
from modelopt.torch.quantization.qtensor.fp8_tensor import FP8QTensor
from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
from safetensors.torch import save_file

g = torch.Generator().manual_seed(0)
w = torch.randn(64, 96, generator=g) * 0.05
w[3] *= 40.0  # a row far above the others: its blocks' E4M3 scales are large
w[5, :16] = 0.0  # an all-zero block: ModelOpt stores scale 1 there
w[7, 20] = 3.0  # an outlier inside one block
out: dict[str, torch.Tensor] = {"original": w.clone()}

q, scale, scale_2 = NVFP4QTensor.quantize(w.clone(), 16)
out["nvfp4.weight"] = q._quantized_data.contiguous()
out["nvfp4.weight_scale"] = scale.contiguous()
out["nvfp4.weight_scale_2"] = scale_2.reshape(()).float().contiguous()
out["nvfp4.dequantized"] = q.dequantize(dtype=torch.float32, scale=scale, double_scale=scale_2,
                                        block_sizes={-1: 16}).contiguous()

q, scale = FP8QTensor.quantize(w.clone())  # per tensor
out["fp8.weight"] = q._quantized_data.contiguous()
out["fp8.weight_scale"] = scale.reshape(()).float().contiguous()
out["fp8.dequantized"] = q.dequantize(dtype=torch.float32, scale=scale).contiguous()

q, scale = FP8QTensor.quantize(w.clone(), axis=0)  # per output channel
out["fp8c.weight"] = q._quantized_data.contiguous()
out["fp8c.weight_scale"] = scale.reshape(-1).float().contiguous()
out["fp8c.dequantized"] = q.dequantize(dtype=torch.float32, scale=scale).contiguous()

for k, v in out.items():
    print(k, v.dtype, list(v.shape))
save_file(out, str(Path(__file__).with_name("modelopt_vectors.safetensors")),
          metadata={"producer": "nvidia-modelopt 0.47.0 (CPU)", "torch": torch.__version__})
