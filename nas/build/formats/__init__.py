"""Quantized checkpoint formats as the Hub publishes them, dequantized on read by
:class:`nas.build.checkpoint.CheckpointReader`: :mod:`~nas.build.formats.fp8` (block-scaled
FP8, DeepSeek-V3), :mod:`~nas.build.formats.mxfp4` (MXFP4 experts, gpt-oss),
:mod:`~nas.build.formats.modelopt` (NVIDIA ModelOpt FP8 / NVFP4 exports)."""
