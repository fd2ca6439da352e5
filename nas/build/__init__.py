"""Blueprint -> torch model: build, initialize from the parent, save and load HF checkpoints.

Importing this package needs torch (an optional extra of puzzle-nas).

* :func:`build_model` - a randomly initialized :class:`~nas.modules.CausalLM` of an arch,
  built block by block in the target dtype (peak memory: the model plus one block in
  float32; :mod:`nas.build.random`);
* :func:`init_from_parent` - a child initialized from the parent's weights
  (:mod:`nas.build.inherit` lists the rule per pruning kind); the parent may be a checkpoint
  folder, streamed one block at a time;
* :func:`save_pretrained` / :func:`load_pretrained` - ``config.json`` + safetensors with the
  HF tensor names of the exported type (:mod:`nas.build.checkpoint` lists them);
* :func:`estimate_build_memory` / :func:`check_memory` - what a build needs, before it starts
  (:mod:`nas.build.memory`);
* :func:`to_transformers` / :func:`from_transformers` - the same model as a Hugging Face
  ``transformers`` model instance and back (when transformers is installed;
  :mod:`nas.build.transformers`).

The package, one module per concern: :mod:`~nas.build.checkpoint` (HF checkpoints, read and
written), :mod:`~nas.build.formats` (quantized checkpoint formats read from the Hub),
:mod:`~nas.build.random`, :mod:`~nas.build.inherit` (one module per block kind),
:mod:`~nas.build.spans` (children with spans), :mod:`~nas.build.memory`,
:mod:`~nas.build.transformers`.
"""

from __future__ import annotations

from nas.build.checkpoint import hf_layout, hf_state_dict, load_pretrained, save_pretrained
from nas.build.inherit import init_from_parent
from nas.build.memory import available_memory, check_memory, estimate_build_memory
from nas.build.random import build_model
from nas.build.transformers import from_transformers, to_transformers

__all__ = ["available_memory", "build_model", "check_memory", "estimate_build_memory",
           "from_transformers", "hf_layout", "hf_state_dict", "init_from_parent",
           "load_pretrained", "save_pretrained", "to_transformers"]
