"""Quantized checkpoint formats as the Hub publishes them, dequantized on read by
:class:`nas.child.checkpoint.CheckpointReader`: :mod:`~nas.child.formats.fp8` (block-scaled
FP8, DeepSeek-V3), :mod:`~nas.child.formats.mxfp4` (MXFP4 experts, gpt-oss),
:mod:`~nas.child.formats.modelopt` (NVIDIA ModelOpt FP8 / NVFP4 exports)."""
