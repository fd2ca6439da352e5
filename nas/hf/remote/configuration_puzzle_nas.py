"""The configuration class puzzle-nas writes into a child's checkpoint folder
(``configuration_puzzle_nas.py``, named by ``auto_map.AutoConfig``).

Every key of ``config.json`` stays an attribute, as in any ``PretrainedConfig``; the
``puzzle_nas`` key holds the architecture the modeling file builds. For the engines that
read a config object through ``trust_remote_code`` it also answers the way they read
NVIDIA's own classes:

* ``nemotron-nas`` (DeciLM): ``block_configs[i].attention`` / ``.ffn`` read as attributes
  (vLLM ``vllm/model_executor/models/nemotron_nas.py``, commit ``00bd1493b3e8``:
  ``block_config.attention.no_op``, ``block_config.ffn.ffn_mult``); an FFN written with
  this library's ``intermediate_size`` has no ``ffn_mult`` attribute, which is the branch
  in which vLLM reads ``block_config.ffn.intermediate_size``.
* ``nemotron_h_puzzle``: ``get_nemotron_h_config_for_layer(i)``, the top-level config with
  block ``i``'s keys laid over it (vLLM ``vllm/model_executor/models/nemotron_h.py``,
  commit ``00b08dc44519``, asks for it on MLP and MoE layers).

Written by puzzle-nas (``nas/hf/remote``); torch-free.
"""

import copy

from transformers import PretrainedConfig


class _Attrs(dict):
    """A dict whose keys also read as attributes (``None`` values are dropped, so a
    missing key is a missing attribute); it serializes as the plain dict it is."""

    def __init__(self, data):
        super().__init__({k: _Attrs(v) if isinstance(v, dict) else v
                          for k, v in data.items() if v is not None})

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class PuzzleNasConfig(PretrainedConfig):
    model_type = "puzzle_nas"

    def __init__(self, **kwargs):
        blocks = kwargs.get("block_configs")
        if self.model_type == "nemotron-nas" and isinstance(blocks, list):
            kwargs["block_configs"] = [_Attrs(b) if isinstance(b, dict) else b for b in blocks]
        # the RoPE keys stay as written: the modeling file reads RoPE from puzzle_nas, and
        # transformers' standardization would rewrite them (and needs keys some types lack)
        rope = {k: kwargs.pop(k) for k in ("rope_scaling", "rope_parameters") if k in kwargs}
        super().__init__(**kwargs)
        self.__dict__["_puzzle_nas_rope"] = rope

    def to_dict(self):
        out = super().to_dict()
        out.pop("_puzzle_nas_rope", None)
        out.pop("rope_parameters", None)  # transformers' standardized copy, not written
        out.update(self.__dict__.get("_puzzle_nas_rope", {}))
        return out

    def get_nemotron_h_config_for_layer(self, layer_idx):
        """The top-level config with ``block_configs[layer_idx]``'s keys laid over it."""
        layer = copy.copy(self)
        for k, v in dict(self.block_configs[layer_idx]).items():
            if k != "block_type":
                setattr(layer, k, v)
        return layer
