"""Modeling code saved into a child's checkpoint folder, for ``trust_remote_code`` loading.

transformers ships no class for most heterogeneous children (``nemotron_h_puzzle``,
``nemotron-nas``, ``deepseek_v3_puzzle``, ``gpt_oss_puzzle``, the ``puzzle_layers``
extension), so :func:`nas.child.save_pretrained` writes, beside ``config.json`` and the
weights, a self-contained, torch-only copy of this project's own modules and an ``auto_map``
pointing at it. Then::

    AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)

builds the same :class:`nas.modules.model.CausalLM` (the same code, the same numerics) under
transformers' :class:`~transformers.PreTrainedModel` (HF ``Trainer``, ``accelerate``, PEFT).

What is written (:func:`remote_files`):

* ``puzzle_nas_<module>.py``: the files of ``nas/modules`` (``layers``, ``moe``, ``mamba``,
  ...) with their ``nas.*`` imports turned into relative imports of these files, as
  transformers' dynamic-module loader copies them (``from .puzzle_nas_layers import ...``);
* ``puzzle_nas_arch.py``: a torch- and pydantic-free stand-in for :mod:`nas.arch`, generated
  from its models (every block kind with its field defaults, :class:`~nas.arch.MuP`, the
  model fields the modules read), and ``InputError``;
* ``configuration_puzzle_nas.py`` (:mod:`nas.hf.remote.configuration_puzzle_nas`) and
  ``modeling_puzzle_nas.py`` (:mod:`nas.hf.remote.modeling_puzzle_nas`).

``config.json`` keeps its engine schema (the type :func:`nas.hf.to_hf` writes) plus
``auto_map`` and one key, ``puzzle_nas`` (:func:`remote_config`): the architecture as
:class:`~nas.arch.ModelArch` writes it and the map from the modules' own names to the
checkpoint's tensor names, so the remote class needs no config parser of its own.
:func:`nas.hf.from_hf` checks that this copy agrees with the config's blocks and drops it.

Needs only torch (and transformers, which loads it); no ``nas``, ``pydantic`` or ``numpy``
import remains in the written files (:func:`remote_files` checks).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from nas.arch import BlockConfig, ModelArch, MuP
from nas.kinds import kinds

FORMAT = 1
"""Version of the ``puzzle_nas`` config key."""
CONFIG_KEY = "puzzle_nas"
MODULES = ("layers", "moe", "mamba", "gpt_oss", "granite", "parallel", *kinds(), "model")
"""The ``nas/modules`` files copied: everything :class:`nas.modules.model.CausalLM` imports,
and each registered kind's module (:mod:`nas.kinds`; ``nas/modules/<kind>.py``)."""
CONFIG_FILE = "configuration_puzzle_nas.py"
MODELING_FILE = "modeling_puzzle_nas.py"
AUTO_MAP = {"AutoConfig": "configuration_puzzle_nas.PuzzleNasConfig",
            "AutoModelForCausalLM": "modeling_puzzle_nas.PuzzleNasForCausalLM"}

REMOTE_FILES = (CONFIG_FILE, MODELING_FILE, "puzzle_nas_*.py")
"""The names of the written files (patterns), which a re-save replaces."""
TRANSFORMERS_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "nemotron_h",
    "deepseek_v3", "gpt_oss", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe",
    "granitemoehybrid", "jamba", "falcon_h1")
"""The exported types transformers ships a class for (5.x ``CONFIG_MAPPING_NAMES``; a test
checks the list against the installed transformers)."""
EXTENSION_KEYS = ("puzzle_layers",)
"""Config keys of this library's extensions that a stock type's transformers class ignores
(so that class would build another model)."""


def needs_remote_code(cfg: dict[str, Any]) -> bool:
    """Whether no stock transformers class holds the model of HF config ``cfg``."""
    return cfg.get("model_type") not in TRANSFORMERS_TYPES or \
        any(k in cfg for k in EXTENSION_KEYS)


_HERE = Path(__file__).resolve().parent
_MODULES_DIR = _HERE.parent.parent / "modules"
_IMPORT_RE = re.compile(r"^(\s*)from (nas\.arch|nas\.modules\.(\w+)|hwprofiles\.errors) import",
                        re.M)
_FOREIGN_RE = re.compile(r"^\s*(?:from|import)\s+(nas|hwprofiles|costmodels|pydantic|numpy)\b",
                         re.M)


def _rewrite(src: str, name: str) -> str:
    def sub(m: re.Match[str]) -> str:
        mod = m.group(2)
        target = "puzzle_nas_arch" if mod in ("nas.arch", "hwprofiles.errors") else \
            f"puzzle_nas_{m.group(3)}"
        return f"{m.group(1)}from .{target} import"

    out = _IMPORT_RE.sub(sub, src)
    left = _FOREIGN_RE.search(out)
    if left:  # a new import in nas/modules that the written copy could not satisfy
        raise RuntimeError(f"nas/modules/{name}.py imports {left.group(1)}, which the "
                           "checkpoint's modeling code cannot import")
    return out


def _defaults(cls: type[Any]) -> dict[str, Any]:
    out = {}
    for name, f in cls.model_fields.items():
        if f.default is not PydanticUndefined:
            out[name] = f.default
        elif f.default_factory is not None:  # pragma: no cover (no such field today)
            out[name] = f.default_factory()
    return out


def _block_classes() -> list[type[BlockConfig]]:
    seen: list[type[BlockConfig]] = []
    todo = list(BlockConfig.__subclasses__())
    while todo:
        c = todo.pop(0)
        if c not in seen:
            seen.append(c)
            todo += c.__subclasses__()
    return seen


def arch_source() -> str:
    """``puzzle_nas_arch.py``: the block classes of :mod:`nas.arch` as plain classes (same
    names, ``kind`` and field defaults), built from the JSON :class:`ModelArch` writes."""
    lines = [
        '"""Generated by puzzle-nas from nas/arch.py: the block configs the modules read, as',
        'plain classes (same names, kinds and field defaults). Torch- and pydantic-free."""',
        "",
        "import json",
        "",
        "",
        "class InputError(ValueError):",
        '    """A bad value in the configuration (puzzle-nas\' hwprofiles.errors.InputError)."""',
        "",
        "    def __init__(self, message, path=None, field=None):",
        "        super().__init__(message if field is None else f\"{field}: {message}\")",
        "",
        "",
        "class _Config:",
        "    _defaults = {}",
        "    kind = None",
        "",
        "    def __init__(self, **fields):",
        "        values = dict(self._defaults)",
        "        values.update(fields)",
        "        values.pop('kind', None)",
        "        for k, v in values.items():",
        "            setattr(self, k, _make(v))",
        "",
        "    def __repr__(self):",
        "        body = ', '.join(f'{k}={v!r}' for k, v in vars(self).items())",
        "        return f'{type(self).__name__}({body})'",
        "",
        "",
        "class BlockConfig(_Config):",
        "    pass",
        "",
    ]
    kinds = []
    for cls in _block_classes():
        kind = cls.model_fields["kind"].default
        d = {k: v for k, v in _defaults(cls).items() if k != "kind"}
        lines += ["", f"class {cls.__name__}(BlockConfig):", f"    kind = {kind!r}",
                  f"    _defaults = {d!r}", ""]
        kinds.append((kind, cls.__name__))
    lines += ["", "class MuP(_Config):", f"    _defaults = {_defaults(MuP)!r}", "", "",
              "KINDS = {" + ", ".join(f"{k!r}: {n}" for k, n in kinds) + "}", "", "",
              "def _make(v):",
              "    if isinstance(v, dict) and v.get('kind') in KINDS:",
              "        return KINDS[v['kind']](**v)",
              "    return v", "", ""]
    model = {k: v for k, v in _defaults(ModelArch).items()}
    lines += [
        "class ModelArch:",
        '    """The model fields the modules read (nas.arch.ModelArch as JSON)."""',
        "",
        f"    _defaults = {model!r}",
        "",
        "    def __init__(self, data):",
        "        values = dict(self._defaults)",
        "        values.update(data)",
        "        for k, v in values.items():",
        "            setattr(self, k, v)",
        "        self.blocks = tuple(_make(b) for b in values['blocks'])",
        "        self.mtp_blocks = tuple(_make(b) for b in values.get('mtp_blocks') or ())",
        "        self.mup = None if values.get('mup') is None else MuP(**values['mup'])",
        "        self.hf_extra = json.loads(values.get('hf_extra_json') or '{}')",
        "",
    ]
    return "\n".join(lines)


def remote_files(model_type: str) -> dict[str, str]:
    """File name -> text of the modeling code written into a checkpoint of ``model_type``."""
    files = {f"puzzle_nas_{m}.py": _rewrite((_MODULES_DIR / f"{m}.py").read_text(), m)
             for m in MODULES}
    # the registered kinds' modules: puzzle_nas_model.py finds them by name (its _sibling),
    # and transformers copies only what a file imports, so the copy imports each by name
    files["puzzle_nas_model.py"] += "".join(
        f"\nfrom .puzzle_nas_{k} import make_mixer as _make_{k}  # noqa: E402,F401  "
        "(copied by transformers)\n" for k in kinds())
    files["puzzle_nas_arch.py"] = arch_source()
    conf = (_HERE / CONFIG_FILE).read_text()
    files[CONFIG_FILE] = conf.replace('model_type = "puzzle_nas"',
                                      f"model_type = {model_type!r}")
    files[MODELING_FILE] = (_HERE / MODELING_FILE).read_text()
    return files


def remote_config(arch: ModelArch, modules: list[tuple[str, str]],
                  stacked: list[tuple[str, str, str, int]]) -> dict[str, Any]:
    """The ``puzzle_nas`` config value: the architecture, ``modules`` (internal module path
    -> HF module path) and ``stacked`` (owner module, stacked parameter, HF name template
    relative to the owner's HF path with ``{j}`` for the expert, expert count)."""
    return {"format": FORMAT, "arch": arch.model_dump(mode="json"),
            "modules": [list(m) for m in modules], "stacked": [list(s) for s in stacked]}
