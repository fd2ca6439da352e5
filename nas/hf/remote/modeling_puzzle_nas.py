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
zeros is refused.

transformers' ``generate`` (greedy, sampling, beams) decodes through puzzle-nas' own caches
(:class:`PuzzleNasCache`, a ``CausalLM.new_cache``: attention KV, Mamba / DeltaNet states,
...), as ``CausalLM.generate`` does: the class opts out of transformers' ``DynamicCache``
(``_supports_default_dynamic_cache``), ``_prepare_cache_for_generation`` puts a puzzle-nas
cache sized for ``generation_config.max_length`` tokens into the generation kwargs (KV
buffers grow geometrically past it, so a longer sequence is never cut), and
``prepare_inputs_for_generation`` passes it with the tokens it does not hold yet (the prompt,
then one token a step). ``forward`` runs those tokens from the cache's state and returns the
cache (the output's ``cache``; ``past_key_values`` in earlier transformers), which
``generate`` hands to the next step; beam search reorders it (``reorder_cache``).
``generate(..., use_cache=False)`` runs the whole sequence at every step instead. Assisted
decoding needs a cache it can crop and is refused (``is_croppable`` is False).

Written by puzzle-nas (``nas/hf/remote``); needs torch and transformers only.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_puzzle_nas import PuzzleNasConfig
from .puzzle_nas_arch import ModelArch
from .puzzle_nas_model import Cache, CausalLM

# the output field (and generate's kwarg) that carries the cache: ``cache`` in the installed
# transformers 5.x, ``past_key_values`` in earlier releases
_CACHE_KEY = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ \
    else "past_key_values"


class PuzzleNasCache(Cache):
    """puzzle-nas' decoding cache (``CausalLM.new_cache``: per-block KV buffers, Mamba /
    DeltaNet states, and ``offset``, the tokens consumed), with what transformers' ``generate``
    asks of the cache it carries between steps."""

    is_compileable = False  # generate never compiles the forward around it
    is_croppable = False  # recurrent states cannot roll back: no assisted decoding

    def get_seq_length(self, layer_idx=0):
        """Tokens already consumed (every block holds the same positions)."""
        return self.offset

    @torch.no_grad()
    def reorder_cache(self, beam_idx):
        """Keep the states of batch rows ``beam_idx`` (beam search), in place. Every state
        tensor is batch-first; entries that view one tensor (a KV buffer and its filled part,
        ``k_buf`` and ``k``) are permuted once, through that tensor."""
        roots = {}
        for layer in self.layers:
            for name, t in layer.items():
                if not isinstance(t, torch.Tensor):
                    continue
                root = t if t._base is None else t._base
                if t.shape[0] != len(beam_idx) or root.shape[0] != len(beam_idx):
                    raise ValueError(f"cache entry {name!r} of shape {tuple(t.shape)} is not "
                                     f"batch-first over the {len(beam_idx)} beams")
                roots[id(root)] = root
        for root in roots.values():
            root.copy_(root.index_select(0, beam_idx.to(root.device)))


def _one_cache(cache, past_key_values):
    """The cache passed under either name (newer transformers say ``cache``)."""
    if cache is not None and past_key_values is not None and cache is not past_key_values:
        raise ValueError("pass the cache once (cache or past_key_values)")
    cache = cache if cache is not None else past_key_values
    if cache is not None and not isinstance(cache, Cache):
        raise TypeError(f"the cache must be puzzle-nas' (model.new_cache()), not "
                        f"{type(cache).__name__}")
    return cache


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

    def new_cache(self, capacity=None):
        """An empty :class:`PuzzleNasCache` (KV buffers preallocated for ``capacity`` tokens
        when given; they grow past it)."""
        return PuzzleNasCache(len(self._puzzle_nas_model.blocks), capacity)

    @classmethod
    def _supports_default_dynamic_cache(cls):
        """No transformers ``DynamicCache``: the blocks read and write puzzle-nas' own."""
        return False

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """transformers' checks of a passed cache and of ``use_cache``, then (with
        ``use_cache``, no cache passed) a puzzle-nas cache for the prompt and every new
        token (``generation_config.max_length``, the whole batch of beams / sequences)."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        if generation_config.use_cache is not False and model_kwargs.get(_CACHE_KEY) is None:
            model_kwargs[_CACHE_KEY] = self.new_cache(generation_config.max_length)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, use_cache=None,
                                      cache=None, past_key_values=None, **kwargs):
        """One step of ``generate``: with a cache (``use_cache``, the default), the tokens of
        ``input_ids`` the cache does not hold yet (the prompt, then the one new token);
        ``use_cache=False``, the whole sequence so far. The cache's own count decides the
        slice (transformers' ``next_sequence_length`` is not needed), so a generate that
        continues from a returned cache runs only what follows it."""
        if use_cache is False:
            return {"input_ids": input_ids, "attention_mask": attention_mask,
                    "use_cache": False}
        cache = _one_cache(cache, past_key_values)
        if cache is None:  # not made by _prepare_cache_for_generation: sized to the prompt
            cache = self.new_cache(input_ids.shape[1])
        held = cache.offset
        if held >= input_ids.shape[1]:
            raise ValueError(f"the cache holds {held} tokens, the sequence has "
                             f"{input_ids.shape[1]}: nothing new to run")
        return {"input_ids": input_ids[:, held:], "attention_mask": attention_mask,
                "use_cache": True, _CACHE_KEY: cache}

    def forward(self, input_ids=None, attention_mask=None, labels=None, return_dict=None,
                use_cache=None, cache=None, past_key_values=None, **kwargs):
        """Logits (and with ``labels`` the loss) of ``input_ids``. With a puzzle-nas cache
        (``cache`` or ``past_key_values``; a new one when ``use_cache=True`` is passed
        without one) ``input_ids`` continue from the cached tokens, the cache is advanced in
        place and returned in the output; without, the whole sequence runs from scratch (the
        training path: no cache is built unless asked)."""
        if input_ids is None:
            raise ValueError("input_ids is required")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError("padding (zeros in attention_mask) is not modeled; pass "
                             "sequences of one length")
        cache = _one_cache(cache, past_key_values)
        if cache is None and use_cache:
            cache = self.new_cache(input_ids.shape[1])
        logits = self._puzzle_nas_model(input_ids, cache)
        loss = None
        if labels is not None:
            shift = logits[:, :-1].float().reshape(-1, logits.shape[-1])
            loss = F.cross_entropy(shift, labels[:, 1:].reshape(-1).to(shift.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_KEY: cache})
