"""Blueprint -> torch model: build, initialize from the parent, save and load HF checkpoints.

Importing this package needs torch (an optional extra of puzzle-nas).

* :func:`build_model` - a randomly initialized :class:`~nas.modules.CausalLM` of an arch,
  built block by block in the target dtype (peak memory: the model plus one block in
  float32; :mod:`nas.child.random`);
* :func:`init_from_parent` - a child initialized from the parent's weights
  (:mod:`nas.child.inherit` lists the rule per pruning kind); the parent may be a checkpoint
  folder, streamed one block at a time;
* :func:`save_pretrained` / :func:`load_pretrained` - ``config.json`` + safetensors with the
  HF tensor names of the exported type (:mod:`nas.child.checkpoint` lists them);
* :func:`estimate_build_memory` / :func:`check_memory` - what a build needs, before it starts
  (:mod:`nas.child.memory`);
* :func:`to_transformers` / :func:`from_transformers` - the same model as a Hugging Face
  ``transformers`` model instance and back (when transformers is installed;
  :mod:`nas.child.transformers`).

The package, one module per concern: :mod:`~nas.child.checkpoint` (HF checkpoints, read and
written), :mod:`~nas.child.formats` (quantized checkpoint formats read from the Hub),
:mod:`~nas.child.random`, :mod:`~nas.child.inherit` (one module per block kind),
:mod:`~nas.child.spans` (children with spans), :mod:`~nas.child.memory`,
:mod:`~nas.child.transformers`.
"""

from __future__ import annotations

from nas.child.checkpoint import hf_layout, hf_state_dict, load_pretrained, save_pretrained
from nas.child.inherit import init_from_parent
from nas.child.memory import available_memory, check_memory, estimate_build_memory
from nas.child.random import build_model
from nas.child.transformers import from_transformers, to_transformers

__all__ = ["available_memory", "build_model", "check_memory", "estimate_build_memory",
           "from_transformers", "hf_layout", "hf_state_dict", "init_from_parent",
           "load_pretrained", "save_pretrained", "to_transformers"]
