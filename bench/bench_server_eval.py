"""The server's evaluation of one round, the largest cost of a 50-client round besides training.

Every round the ServerApp scores the global model on the validation and test parts
(:func:`corbin_fl.app.server_app.run_training`): on Fashion-MNIST 12,000 + 10,000 images, about
8.5 MFLOP each through the small CNN (its two 3x3 convolutions and two dense layers), 0.19 TFLOP
a round. This times :func:`corbin_fl.app.training.evaluate` on both parts with the model's weights
in the default (NCHW) layout and channels-last (what the ServerApp uses), alternating
``--repeats`` times after one warm-up each, and prints the median CPU seconds (this process,
every torch thread) and wall seconds of each, and that the two give the same accuracy and loss.

Usage::

    python bench/bench_server_eval.py                       # Fashion-MNIST at its default folder
    python bench/bench_server_eval.py --dataset mnist --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    """Parse the arguments, time both layouts, print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion-mnist", help="(default: fashion-mnist)")
    parser.add_argument("--data-dir", default="", help="(default: the data set's own)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per layout (3)")
    parser.add_argument("--batch-size", type=int, default=512, help="eval-batch-size (512)")
    args = parser.parse_args()
    if args.repeats < 1 or args.batch_size < 1:
        parser.error("--repeats and --batch-size must be >= 1")

    from corbin_fl.app.data import dataset_info, server_datasets
    from corbin_fl.app.models import build_model
    from corbin_fl.app.training import evaluate

    official = args.dataset in ("fashion-mnist", "mnist-idx", "cifar10")
    info = dataset_info(args.dataset, args.data_dir or None)
    val, test = server_datasets(
        args.dataset, data_dir=args.data_dir or None, use_official_test=official
    )
    plain = build_model("cnn", info.in_channels, info.num_classes, seed=0)
    fast = build_model("cnn", info.in_channels, info.num_classes, seed=1)
    fast.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    fast.load_state_dict(plain.state_dict(), strict=True)

    def score(model: torch.nn.Module) -> tuple[float, float, tuple[float, ...]]:
        c0, t0 = time.process_time(), time.perf_counter()
        v = evaluate(model, val, batch_size=args.batch_size, device="cpu")
        t = evaluate(model, test, batch_size=args.batch_size, device="cpu")
        return time.process_time() - c0, time.perf_counter() - t0, (v.loss, v.accuracy, t.loss)

    times: dict[str, list[tuple[float, float]]] = {"NCHW": [], "channels-last": []}
    results = {}
    for name, model in (("NCHW", plain), ("channels-last", fast)):
        results[name] = score(model)[2]  # warm-up
    for _ in range(args.repeats):
        for name, model in (("NCHW", plain), ("channels-last", fast)):
            cpu, wall, _ = score(model)
            times[name].append((cpu, wall))
    n = len(val) + len(test)
    print(f"{info.title}: {len(val):,} validation + {len(test):,} test images, "
          f"{torch.get_num_threads()} torch threads, median of {args.repeats}")  # fmt: skip
    for name, runs in times.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(
            f"  {name:14s} {cpu:6.2f} CPU-s  {wall:6.2f} s wall  ({1e3 * cpu / n:.3f} CPU-ms/image)"
        )
    a, b = results["NCHW"], results["channels-last"]
    same = a[1] == b[1] and abs(a[0] - b[0]) <= 1e-5 * abs(a[0]) and abs(a[2] - b[2]) <= 1e-5
    print(f"  same results: {same} (val loss {a[0]:.6f} / {b[0]:.6f}, val acc {a[1]} / {b[1]})")


if __name__ == "__main__":
    main()
