"""PyTorch helpers: protect a model (and its optimizer) where it lives.

    rt = dckpt.Runtime(MPI.COMM_WORLD, persistent="ckpt")
    dckpt.torch.protect_module(rt, model, optimizer)
    epoch = rt.restart_latest("train") or 0
    for epoch in range(epoch + 1, epochs + 1):
        train_one_epoch(model, optimizer)
        rt.checkpoint("train", epoch)

GPU tensors stay on the GPU: the runtime de-duplicates them there.
"""

import torch


def _tensors(model, optimizer):
    """(name, tensor) of every parameter, buffer and optimizer state tensor,
    in a stable order: the module's named parameters and buffers, then the
    optimizer's state by parameter index and key (sorted)."""
    for name, t in model.named_parameters():
        yield "param:" + name, t.data
    for name, t in model.named_buffers():
        yield "buffer:" + name, t
    if optimizer is not None:
        index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
        for p, state in sorted(optimizer.state.items(), key=lambda kv: index.get(id(kv[0]), -1)):
            for key in sorted(state):
                value = state[key]
                if torch.is_tensor(value):
                    yield f"optim:{index.get(id(p), -1)}:{key}", value


def protect_module(rt, model, optimizer=None, first_id=0):
    """Protects every parameter, buffer and optimizer state tensor of
    `model` (and `optimizer`) where it lives, as regions `first_id`, +1, ...
    in a stable order; returns the ids as {name: id}. An optimizer keeps no
    state before its first step: take one step (or call this again after
    it) so that its moments are protected too. Every tensor must be
    contiguous (`model.to(memory_format=torch.contiguous_format)`)."""
    ids = {}
    for i, (name, t) in enumerate(_tensors(model, optimizer)):
        rt.protect(first_id + i, t)
        ids[name] = first_id + i
    return ids
