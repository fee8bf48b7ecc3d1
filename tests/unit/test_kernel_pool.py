"""The kernels' thread pool under two callers at once: two models' engines evaluate on their own streams, each
primitive's parallel_for reaching the one pool. Interleaved runs once shared the pool's state and spun forever
(a server with two models froze); each caller must finish with its own, correct result."""

from __future__ import annotations

import threading
import time
from types import ModuleType

import mlx.core as mx
import numpy as np

from tests.unit.test_kernels import random_blocks

ROUNDS = 400


def test_two_streams_share_the_pool_and_both_finish(ext: ModuleType) -> None:
    rng = np.random.default_rng(3)
    k, n = 1024, 2048  # enough rows that every matmul splits into pool tasks
    w = mx.array(random_blocks(rng, "Q8_0", n, k))
    xs = [mx.array(rng.standard_normal((1, k)).astype(np.float32)) for _ in range(2)]
    want = [np.array(ext.matmul(x, w, 8, k)) for x in xs]
    ext.set_threads(2)
    results: list[list[np.ndarray]] = [[], []]

    def caller(i: int) -> None:
        stream = mx.new_stream(mx.cpu)
        for _ in range(ROUNDS):
            ys = [ext.matmul(xs[i], w, 8, k, stream=stream) for _ in range(4)]
            mx.async_eval(ys)  # the stream's thread runs them while the other caller builds and evaluates its own
            time.sleep(0.0005)  # this thread lets go of the GIL, as an engine does between steps
            mx.eval(ys)
            results[i].extend(np.array(y) for y in ys)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a caller is stuck in the kernels' pool"
    for i in range(2):
        assert len(results[i]) == 4 * ROUNDS
        for y in results[i]:
            np.testing.assert_array_equal(y, want[i])
