"""PyTorch helpers: protect a model (and its optimizer) where it lives.

    rt = dckpt.Runtime(MPI.COMM_WORLD, persistent="ckpt")
    dckpt.torch.protect_module(rt, model, optimizer)
    epoch = rt.restart_latest("train") or 0
    for epoch in range(epoch + 1, epochs + 1):
        train_one_epoch(model, optimizer)
        rt.checkpoint("train", epoch)

GPU tensors stay on the GPU: the runtime de-duplicates them there (and,
with the collective step, across the ranks of a data-parallel job, whose
replicas are the same bytes).
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


def init_optimizer_state(optimizer):
    """Makes the state an optimizer would make at its first step, now, so
    that it can be protected (and restored into) before training starts.

    Takes one step with zero gradients and a learning rate of 0 (the
    parameters do not change), then sets every state tensor it made to
    zero: what Adam, AdamW, NAdam, RAdam, Adamax, RMSprop and SGD with
    momentum (dampening 0) start their first step from, so training goes on
    bit for bit as it would have. Parameters that already have state are
    left alone. Returns the number of parameters given state."""
    fresh = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad and not optimizer.state.get(p)]
    if not fresh:
        return 0
    grads = {p: p.grad for p in fresh}
    lrs = [g["lr"] for g in optimizer.param_groups]
    try:
        for p in fresh:
            p.grad = torch.zeros_like(p)
        for g in optimizer.param_groups:
            g["lr"] = torch.zeros_like(g["lr"]) if torch.is_tensor(g["lr"]) else 0.0
        with torch.no_grad():
            before = [p.detach().clone() for p in fresh]
            optimizer.step()
            for p, was in zip(fresh, before):
                p.copy_(was)  # exact, whatever a zero step did to -0.0 or NaN
            for p in fresh:
                for value in optimizer.state[p].values():
                    if torch.is_tensor(value):
                        value.zero_()
    finally:
        for g, lr in zip(optimizer.param_groups, lrs):
            g["lr"] = lr
        for p, grad in grads.items():
            p.grad = grad
    return len(fresh)


def protect_module(rt, model, optimizer=None, first_id=0):
    """Protects every parameter, buffer and optimizer state tensor of
    `model` (and `optimizer`) where it lives, as regions `first_id`, +1, ...
    in a stable order; returns the ids as {name: id}.

    An optimizer keeps no state before its first step: its state is made
    now ([`init_optimizer_state`]) so that its moments are protected too,
    and a restart can restore them before training goes on. Every tensor
    must be contiguous (`model.to(memory_format=torch.contiguous_format)`)."""
    if optimizer is not None:
        init_optimizer_state(optimizer)
    ids = {}
    for i, (name, t) in enumerate(_tensors(model, optimizer)):
        rt.protect(first_id + i, t)
        ids[name] = first_id + i
    return ids
