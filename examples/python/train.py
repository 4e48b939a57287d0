"""Data-parallel PyTorch training over mpi4py that checkpoints the model and
its AdamW state through dckpt, where they live (GPU memory stays on the GPU),
and restarts from its newest checkpoint:

    mpirun -np 4 python examples/python/train.py [--steps 60] [--every 5]
        [--width 1024] [--dir target/train] [--kill-at STEP] [--device cuda|cpu]

Every rank holds the same model and optimizer state (a replica); each step
each rank computes the gradients of its own share of a batch, the ranks sum
them (MPI all-reduce, or NCCL with `--torch-distributed`), and every rank
takes the same AdamW step. The batches are made from the step number, so a
run that is killed (`--kill-at STEP`: the last rank SIGKILLs itself there)
and started again resumes from its newest checkpoint and ends with the same
weights, bit for bit, as a run never interrupted: rank 0 prints their digest.

The replicas are the same bytes: with the collective step (the default),
the ranks store about one replica a version between them, not one each.
"""

import argparse
import hashlib
import os
import signal
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before CUDA starts

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import dckpt  # noqa: E402
import dckpt.torch  # noqa: E402


def model_of(width):
    return torch.nn.Sequential(
        torch.nn.Linear(256, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, 10),
    )


def batch(step, rank, device, rows=64):
    """This rank's share of step `step`'s batch, the same on every run."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(rows, 256, generator=g)
    y = torch.randint(0, 10, (rows,), generator=g)
    return x.to(device), y.to(device)


class Summed:
    """Sums the ranks' gradients: one flat buffer, one all-reduce a step."""

    def __init__(self, comm, params, nccl):
        self.comm, self.params, self.nccl = comm, list(params), nccl
        self.n = sum(p.numel() for p in self.params)

    def __call__(self):
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        if self.nccl:
            torch.distributed.all_reduce(flat)
        else:
            host = flat.cpu().numpy()
            self.comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
            flat = torch.from_numpy(host).to(flat.device)
        flat /= self.comm.Get_size()
        at = 0
        for p in self.params:
            p.grad.copy_(flat[at : at + p.numel()].view_as(p))
            at += p.numel()


def digest(model, optimizer):
    h = hashlib.blake2b(digest_size=16)
    for _, t in dckpt.torch._tensors(model, optimizer):
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--width", type=int, default=1024, help="hidden width (1024: 2.4 M parameters)")
    ap.add_argument("--dir", default="target/train", help="where the checkpoints go (scratch and persistent)")
    ap.add_argument("--kill-at", type=int, default=None, help="SIGKILL the last rank at this step")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda where there is one)")
    ap.add_argument("--torch-distributed", action="store_true", help="sum gradients with NCCL (GPU)")
    a = ap.parse_args()

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = f"cuda:{torch.cuda.current_device()}"
    torch.use_deterministic_algorithms(True)
    if a.torch_distributed:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getuid() % 1000))
        torch.distributed.init_process_group("nccl", rank=rank, world_size=size)

    torch.manual_seed(0)  # the same initial weights on every rank
    model = model_of(a.width).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step = np.zeros(1, dtype=np.int64)
    summed = Summed(comm, model.parameters(), a.torch_distributed)
    loss_fn = torch.nn.CrossEntropyLoss()

    settings = dict(scratch=os.path.join(a.dir, "scratch"), persistent=os.path.join(a.dir, "persistent"))
    with dckpt.Runtime(comm, **settings) as rt:
        ids = dckpt.torch.protect_module(rt, model, optimizer)
        rt.protect(len(ids), step)
        if rt.restart_latest("train") is not None and rank == 0:
            print(f"train: restarted from the checkpoint of step {step[0]}", flush=True)
        calls = []
        while step[0] < a.steps:
            if a.kill_at is not None and step[0] == a.kill_at and rank == size - 1:
                print(f"train: rank {rank} kills itself at step {step[0]} (--kill-at)", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = batch(int(step[0]), rank, device)
            optimizer.zero_grad(set_to_none=False)
            loss_fn(model(x), y).backward()
            summed()
            optimizer.step()
            step[0] += 1
            if step[0] % a.every == 0:
                if device.startswith("cuda"):
                    torch.cuda.synchronize()  # the step's kernels are done with the weights
                t = time.perf_counter()
                rt.checkpoint("train", int(step[0]))
                calls.append(time.perf_counter() - t)
        held = sum(t.numel() * t.element_size() for _, t in dckpt.torch._tensors(model, optimizer))
        calls = comm.gather(calls, root=0)
    d = digest(model, optimizer)
    digests = comm.gather(d, root=0)
    if rank == 0:
        assert len(set(digests)) == 1, f"the replicas differ: {digests}"
        steady = [c for mine in calls for c in mine[1:]]
        mid = 1e3 * float(np.median(steady)) if steady else float("nan")
        print(
            f"train: {size} ranks on {device.split(':')[0]}, {a.steps} steps, {held} bytes a replica, "
            f"steady call {mid:.2f} ms, weights digest {d}",
            flush=True,
        )
    if a.torch_distributed:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
