"""The modeling class puzzle-nas writes into a child's checkpoint folder
(``modeling_puzzle_nas.py``, named by ``auto_map.AutoModelForCausalLM``).

:class:`PuzzleNasForCausalLM` builds puzzle-nas' own ``CausalLM`` (the ``puzzle_nas_*.py``
files beside this one: the project's ``nas/modules``, imports made relative) from the
architecture in ``config.puzzle_nas``, then registers its modules under the checkpoint's
tensor names (``config.puzzle_nas["modules"]``), so transformers loads the safetensors
files by name into the very modules the forward pass runs. Routed experts, which the
modules keep stacked (``experts_up`` of shape ``(E, W, h)``) and the checkpoint stores one
by one (``experts.{j}.up_proj.weight``), become per-expert parameters that the forward pass
stacks (a copy per call; gradients flow to each expert).

``forward(input_ids, labels=...)`` returns ``logits`` and, with labels, the mean
next-token cross-entropy over labels other than -100 (computed in float32), as transformers'
causal LMs do; HF ``Trainer`` trains it. Padding is not modeled: an ``attention_mask`` with
zeros is refused. transformers' ``generate`` works (greedy, sampling, beams) but keeps no
KV cache: each step runs the whole sequence so far (quadratic in its length); puzzle-nas'
``CausalLM.generate`` and the serving engines decode through caches.

Written by puzzle-nas (``nas/hf/remote``); needs torch and transformers only.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_puzzle_nas import PuzzleNasConfig
from .puzzle_nas_arch import ModelArch
from .puzzle_nas_model import CausalLM


def _walk(module, path):
    for part in path:
        module = getattr(module, part)
    return module


def _stacked(head, tail):
    return property(lambda self: torch.stack([_walk(e, tail) for e in _walk(self, head)]))


def _unstack(owner, attr, template, count):
    """Replace ``owner``'s stacked parameter ``attr`` (``count`` experts) by one parameter
    per expert at ``template`` (relative, ``{j}`` = expert), read back stacked through a
    property of a per-instance subclass."""
    param = owner._parameters.pop(attr)
    head, tail = template.split("{j}")
    head = tuple(p for p in head.split(".") if p)
    tail = tuple(p for p in tail.split(".") if p)
    parent = owner
    for i, part in enumerate(head):
        if part not in parent._modules:
            parent.add_module(part, nn.ModuleList() if i == len(head) - 1 else nn.Module())
        parent = parent._modules[part]
    while len(parent) < count:
        parent.append(nn.Module())
    for j in range(count):
        node = parent[j]
        for part in tail[:-1]:
            if part not in node._modules:
                node.add_module(part, nn.Module())
            node = node._modules[part]
        node.register_parameter(tail[-1], nn.Parameter(param[j].detach().clone(),
                                                       requires_grad=param.requires_grad))
    cls = type(owner)
    if "_puzzle_nas_stacked" not in cls.__dict__:
        cls = type(cls.__name__, (cls,), {"_puzzle_nas_stacked": True})
        owner.__class__ = cls
    setattr(cls, attr, _stacked(head, tail))


def _resolve(root, path):
    """``root.get_submodule(path)``, also through plain (unregistered) attributes."""
    for part in path.split("."):
        root = getattr(root, part)
    return root


class PuzzleNasForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = PuzzleNasConfig
    base_model_prefix = "puzzle_nas_no_base_model"
    supports_gradient_checkpointing = False
    _no_split_modules = []

    def __init__(self, config):
        super().__init__(config)
        spec = config.puzzle_nas
        if spec.get("format") != 1:
            raise ValueError(f"config.puzzle_nas format {spec.get('format')!r} is not 1; "
                             "this modeling file reads format 1")
        inner = CausalLM(ModelArch(spec["arch"]))
        for owner, attr, template, count in spec["stacked"]:
            _unstack(inner.get_submodule(owner), attr, template, count)
        mapped = dict(spec["modules"])

        def implied(src):  # where src would appear inside its nearest placed ancestor
            a = src
            while a:
                if a in mapped:
                    return mapped[a] + src[len(a):]
                a = a.rpartition(".")[0]
            return None

        # a submodule the checkpoint names differently from its placed parent (Qwen's
        # shared_expert for shared_experts) leaves the parent's registry, staying a plain
        # attribute for the forward pass, so each tensor has one name
        for src, dst in spec["modules"]:
            par, _, name = src.rpartition(".")
            if par and implied(par) is not None and f"{implied(par)}.{name}" != dst:
                owner = inner.get_submodule(par)
                owner.__dict__[name] = owner._modules.pop(name)
        # the modules under the checkpoint's names; shortest paths first, so a module
        # registered at a path adopts the ones registered below it
        for src, dst in sorted(spec["modules"], key=lambda m: (m[1].count("."), m[1])):
            self._place(dst, _resolve(inner, src))
        object.__setattr__(self, "_puzzle_nas_model", inner)  # not a second registration
        self.post_init()

    def _place(self, path, module):
        parts = path.split(".")
        parent = self
        for part in parts[:-1]:
            if part not in parent._modules:
                parent.add_module(part, nn.Module())
            parent = parent._modules[part]
        old = parent._modules.get(parts[-1])
        if old is module:  # already there, inside its placed parent
            return
        if old is not None:
            if type(old) is not nn.Module:
                raise ValueError(f"two modules map to {path}")
            for k, v in old._modules.items():
                module.add_module(k, v)
        parent.add_module(parts[-1], module)

    @property
    def puzzle_nas_model(self):
        """The puzzle-nas ``CausalLM`` whose modules this model holds."""
        return self._puzzle_nas_model

    def _init_weights(self, module):
        """Weights come from the checkpoint; nothing to initialize."""

    def get_input_embeddings(self):
        return self._puzzle_nas_model.embed

    def get_output_embeddings(self):
        return None  # puzzle-nas' CausalLM ties (or not) by itself

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """Every step of ``generate`` runs the whole sequence so far: no KV cache is kept,
        so the forward pass must see every token, not only the new one."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def forward(self, input_ids=None, attention_mask=None, labels=None, return_dict=None,
                **kwargs):
        if input_ids is None:
            raise ValueError("input_ids is required")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("padding (zeros in attention_mask) is not modeled; pass "
                             "sequences of one length")
        logits = self._puzzle_nas_model(input_ids)
        loss = None
        if labels is not None:
            shift = logits[:, :-1].float().reshape(-1, logits.shape[-1])
            loss = F.cross_entropy(shift, labels[:, 1:].reshape(-1).to(shift.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)
