"""Python references of the server's ops (qpool::quant_linear, qpool::rope) for eager runs and
tracing: registered only when nobody else did, so the server's C++ library, loaded into the same
process, wins."""

from __future__ import annotations

from typing import Callable, Optional

import torch


def registered(name: str) -> bool:
    """Whether torch.ops.qpool.<name> exists in this process."""
    try:
        getattr(torch.ops.qpool, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def register(schema: str, reference: Callable, fake: Callable) -> Optional[torch.library.Library]:
    """Defines qpool::<schema's name> with `reference` for every device and `fake` for shapes
    (torch.export), unless it exists; returns the library that holds it (keep it alive)."""
    name = schema.split("(", 1)[0]
    if registered(name):
        return None
    lib = torch.library.Library("qpool", "FRAGMENT")
    lib.define(schema)
    lib.impl(name, reference, "CompositeExplicitAutograd")
    torch.library.register_fake(f"qpool::{name}", fake, lib=lib)
    return lib
