"""Torch modules for every block kind and the causal LM that stacks them.

Importing this package needs torch (an optional extra of puzzle-nas).
"""

from nas.modules.layers import AttentionMixer, FFNMixer, LinearMixer, RMSNorm, activation
from nas.modules.mamba import MambaMixer, ssd_chunked, ssd_step
from nas.modules.model import Block, Cache, CausalLM, make_mixer
from nas.modules.moe import MoEMixer
from nas.modules.parallel import ParallelMixer

__all__ = [
    "AttentionMixer", "Block", "Cache", "CausalLM", "FFNMixer", "LinearMixer", "MambaMixer",
    "MoEMixer", "ParallelMixer", "RMSNorm", "activation", "make_mixer", "ssd_chunked",
    "ssd_step",
]
