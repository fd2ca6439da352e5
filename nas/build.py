"""Blueprint -> torch model: build, initialize from the parent, save and load HF checkpoints.

Importing this package needs torch (an optional extra of puzzle-nas).

* :func:`build_model` - a randomly initialized :class:`~nas.modules.CausalLM` of an arch;
* :func:`init_from_parent` - a child initialized from the parent's weights
  (:mod:`nas.build_inherit` lists the rule per pruning kind);
* :func:`save_pretrained` / :func:`load_pretrained` - ``config.json`` + safetensors with the
  HF tensor names of the exported type (:mod:`nas.build_checkpoint` lists them).
"""

from __future__ import annotations

import torch

from nas.arch import ModelArch
from nas.modules.model import CausalLM


def build_model(arch: ModelArch, seed: int | None = 0,
                dtype: torch.dtype = torch.float32) -> CausalLM:
    """A randomly initialized model of ``arch`` (seeded; ``seed=None`` uses the global RNG).

    Parameters match ``arch.param_counts().total`` exactly (MTP blocks are not built).
    """
    if seed is None:
        model = CausalLM(arch)
        model.reset_parameters()
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = CausalLM(arch)
            model.reset_parameters()
    return model.to(dtype)


from nas.build_checkpoint import hf_layout, hf_state_dict, load_pretrained, save_pretrained  # noqa: E402
from nas.build_inherit import init_from_parent  # noqa: E402

__all__ = ["build_model", "hf_layout", "hf_state_dict", "init_from_parent", "load_pretrained",
           "save_pretrained"]
