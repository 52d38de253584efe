"""An export's dense model: the CTR model with its embedding taken out, so it maps the dense
features and the rows the tables gave ``(B, F, D)`` (fields of several widths: a tuple, a tensor
a width) to logits.

Written twice: its parameters (``dense.pt``, what het itself loads back into the model's class)
and, where ``torch.export`` captures it, a program (``dense.pt2``) that runs without het's
model code (torch.export.load). The program is captured for any batch size (a dynamic first
dimension); a model it cannot capture is exported with its parameters alone, and the manifest
says why (``dense.program_error``).
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import nn

from het.train.tasks import CTR_MODELS

PARAMS, PROGRAM = "dense.pt", "dense.pt2"


def build(model: dict) -> nn.Module:
    """The model's class with an identity for its embedding: ``module(dense, rows)`` -> logits.
    ``model``: the manifest's ``model`` (name, fields, dim, dense features)."""
    if model["name"] not in CTR_MODELS:
        raise ValueError(f"model {model['name']!r}: an export holds one of {sorted(CTR_MODELS)}")
    dim = model["dim"] if isinstance(model["dim"], int) else tuple(model["dim"])  # a width a field: several tables
    module = CTR_MODELS[model["name"]](nn.Identity(), num_fields=model["num_fields"], dim=dim,
                                       num_dense=model["num_dense"])
    return module.eval()


def load_params(module: nn.Module, state: dict, flat: torch.Tensor | None = None) -> nn.Module:
    """Set ``module``'s parameters from a checkpoint's model state (the embedding's entries are
    not there), or, for a job whose dense parameters lived on the PS (mode ps), from ``flat``:
    every parameter in order, flattened, as :class:`het.dist.dense.PSDense` keeps them."""
    if flat is not None:
        params = [p for p in module.parameters() if p.requires_grad]
        need = sum(p.numel() for p in params)
        if flat.numel() < need:
            raise ValueError(f"the PS's dense table holds {flat.numel()} values, the model needs {need}")
        offset = 0
        with torch.no_grad():
            for p in params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        return module
    state = {k: torch.as_tensor(v) for k, v in state.items() if not k.startswith("embedding.")}
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"the checkpoint's dense model does not fit {type(module).__name__}: missing {missing}, "
                         f"unexpected {unexpected}")
    return module


def load(root: str, model: dict) -> nn.Module:
    """The dense model of the export in ``root`` as its class, with the exported parameters."""
    state = torch.load(os.path.join(root, PARAMS), weights_only=True, map_location="cpu")
    return load_params(build(model), state)


def capture(module: nn.Module, num_dense: int, num_fields: int, dim):
    """``torch.export``'s program of ``module`` for any batch size, or ``(None, why)``. ``dim``: one
    width, or a width a field (the rows then come as a tuple, a tensor a width)."""
    from het.models.fields import width_groups

    batch = torch.export.Dim("batch", min=1, max=1 << 24)
    if isinstance(dim, int):
        rows, rows_shape = torch.zeros(4, num_fields, dim), {0: batch}
    else:
        groups = width_groups(num_fields, tuple(dim))
        rows = tuple(torch.zeros(4, f, w) for f, w in groups)
        rows_shape = tuple({0: batch} for _ in groups)
    example = (torch.zeros(4, num_dense), rows)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.export(module, example, dynamic_shapes=({0: batch}, rows_shape))
    except Exception as e:  # noqa: BLE001 - any failure to capture means: no program, say why
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return program, None
