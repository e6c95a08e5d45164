"""The main job: train a classifier SPMD over 8 virtual CPU devices, next to torch eager.

scikit-learn's handwritten digits (8x8 images, 10 classes) train a small MLP. The lazy model is
an ordinary torch.nn module moved to the lazy device: every step is recorded as an IR graph,
compiled once by XLA, then only looked up and run across a 4x2 mesh (batch split over "data",
the hidden layer split over "model"). The same model trained by torch eager on CPU, from the
same initial weights and batches, is the reference.
"""

import copy
import sys
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import ir_runtime as irt

EPOCHS, BATCH, LR = 25, 64, 0.1


def data():
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        x, digits.target, test_size=0.2, random_state=0, stratify=digits.target
    )
    return (
        torch.from_numpy(x_train),
        torch.from_numpy(y_train),
        torch.from_numpy(x_test),
        torch.from_numpy(y_test),
    )


def batches(x, y, epoch):
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
    for k in range(0, len(x) - BATCH + 1, BATCH):  # whole batches only: one program
        idx = order[k : k + BATCH]
        yield x[idx], y[idx]


def bar(done, total, text, width=30):
    filled = int(width * done / total)
    sys.stdout.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {text}")
    sys.stdout.flush()


def main():
    irt.init(cpu_devices=8)
    mesh = irt.Mesh(np.arange(8), (4, 2), ("data", "model"))
    x_train, y_train, x_test, y_test = data()

    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10))
    model = irt.to_lazy(copy.deepcopy(eager))
    irt.mark_sharding(model[0].weight, mesh, ("model", None))  # hidden units over "model"
    irt.mark_sharding(model[0].bias, mesh, ("model",))
    irt.mark_sharding(model[2].weight, mesh, (None, "model"))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    opt_eager = torch.optim.SGD(eager.parameters(), lr=LR)

    steps = EPOCHS * (len(x_train) // BATCH)
    print(
        f"digits: {len(x_train)} training, {len(x_test)} held-out images; {EPOCHS} epochs of "
        f"{steps // EPOCHS} steps, SPMD over {mesh}"
    )
    start, eager_seconds, done = time.perf_counter(), 0.0, 0
    for epoch in range(EPOCHS):
        losses, correct, seen = [], [], 0
        for xb, yb in batches(x_train, y_train, epoch):
            x, y = irt.to_lazy(xb), irt.to_lazy(yb)
            irt.mark_sharding(x, mesh, ("data", None))
            irt.mark_sharding(y, mesh, ("data",))
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            hits = (logits.argmax(dim=1) == y).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            irt.mark_step()
            losses.append(loss)
            correct.append(hits)
            seen += len(yb)

            t0 = time.perf_counter()
            eager_loss = torch.nn.functional.cross_entropy(eager(xb), yb)
            eager_loss.backward()
            opt_eager.step()
            opt_eager.zero_grad()
            eager_seconds += time.perf_counter() - t0
            done += 1
        mean_loss = float(np.mean([loss.item() for loss in losses]))
        accuracy = sum(h.item() for h in correct) / seen
        bar(done, steps, f"epoch {epoch + 1}: loss {mean_loss:.3f}, train accuracy {accuracy:.3f}")
    lazy_seconds = time.perf_counter() - start - eager_seconds
    print()

    with torch.no_grad():
        test_x = irt.to_lazy(x_test)
        predicted = irt.to_torch(model(test_x).argmax(dim=1))
        eager_predicted = eager(x_test).argmax(dim=1)
    accuracy = (predicted == y_test).float().mean().item()
    eager_accuracy = (eager_predicted == y_test).float().mean().item()
    print(f"held-out accuracy: lazy SPMD {accuracy:.4f}, torch eager {eager_accuracy:.4f}")
    print(
        f"time: lazy SPMD {lazy_seconds:.1f} s (compile included), "
        f"torch eager {eager_seconds:.1f} s"
    )
    print("\nfirst layer's weight (hidden units x inputs):")
    print(irt.visualize_sharding(model[0].weight))
    print("\nsecond layer's weight (classes x hidden units):")
    print(irt.visualize_sharding(model[2].weight))
    counters = irt.metrics()["counters"]
    print(
        f"\n{counters['CompileCount']} compiles (the training step once, the evaluation once), "
        f"{counters['CacheHit']} cache hits\n"
    )
    print(irt.metrics_report())
    assert abs(accuracy - eager_accuracy) <= 0.02, "the lazy model must learn as eager does"


if __name__ == "__main__":
    main()
