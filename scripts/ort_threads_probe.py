"""How many threads ONNX Runtime's CPU session starts with intra_op_num_threads=0, and what that costs,
when the process may run on fewer CPUs than the host has (taskset, a container's cpuset).

Run pinned: ``taskset -c 0,1 python scripts/ort_threads_probe.py MODEL.onnx`` (or inside a cgroup
with a CPU quota). Prints the CPUs FastPath counts for the process (fastpath.engines.cpus) and, per
intra_op_num_threads setting (0 = ONNX Runtime's default, then 1 and 2), the process's thread count
after the session is made, batch-1 p50 (28 tokens) and batch-64 p50 in ms.
"""

import os
import sys
import time

import numpy as np
import onnxruntime as ort


def main(path: str) -> None:
    from fastpath.engines.cpus import ort_intra_op_threads, process_cpus

    print("affinity", sorted(os.sched_getaffinity(0)), "os.cpu_count", os.cpu_count(), "ort", ort.__version__,
          "| fastpath: process_cpus", process_cpus(), "intra_op_threads for 0:", ort_intra_op_threads(0))
    rng = np.random.default_rng(0)
    for threads in (0, 1, 2):
        before = len(os.listdir("/proc/self/task"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        created = len(os.listdir("/proc/self/task")) - before
        results = {}
        for rows, length, reps in ((1, 28, 200), (64, 32, 10)):
            feeds = {"input_ids": rng.integers(1000, 2000, (rows, length), dtype=np.int64),
                     "attention_mask": np.ones((rows, length), np.int64),
                     "token_type_ids": np.zeros((rows, length), np.int64)}
            feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
            for _ in range(3):
                session.run(None, feeds)
            times = []
            for _ in range(reps):
                start = time.perf_counter()
                session.run(None, feeds)
                times.append(time.perf_counter() - start)
            results[f"b{rows}"] = round(float(np.median(times)) * 1e3, 2)
        print(f"intra_op_num_threads={threads}: threads started {created}; p50 ms {results}", flush=True)
        del session


if __name__ == "__main__":
    main(sys.argv[1])
