"""Block kinds, one module each, and their registry (:mod:`nas.kinds.base`).

``nas/kinds/<kind>.py`` declares a kind end to end: its config, its search-space axis and
alternatives, its serving rules, its quantizable linears and its Hugging Face dialects,
registered as a :class:`KindSpec`; every module here is imported when the registry is first
read. docs/adding-a-block-kind.md lists the files a new kind touches.
"""

from nas.kinds.base import (
    AxisSpace,
    BlockConfig,
    KindSpec,
    NoOp,
    get,
    hf_module,
    kinds,
    register,
    spec_of,
    swap_of,
)

__all__ = ["AxisSpace", "BlockConfig", "KindSpec", "NoOp", "get", "hf_module", "kinds",
           "register", "spec_of", "swap_of"]
