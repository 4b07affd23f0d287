"""A multi-process gRPC load generator for text_embedding in Python, for the design A/Bs of triton_gpu.py.

Served throughput figures come from perf_analyzer (benchmarks/perf_analyzer.py); this generator measures what a
Python client sees (tritonclient, or a lean client of pre-serialized requests) and accounts the CPU of every
process group over the cell (:class:`stub_probes.CpuAccount`).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path
from typing import Any

import numpy as np
from stub_probes import CpuAccount, start_py_spy, summarize_py_spy  # beside this file


def raw_infer_payloads(model: str, texts: list[str], bulk: int) -> list[bytes]:
    """Serialized ``ModelInferRequest`` s (KServe v2 gRPC, Triton's ``service.proto``) asking for
    ``EMBEDDING`` only: payload ``j`` carries texts ``j .. j+bulk-1`` (cyclic) as one BYTES tensor
    [bulk, 1] in ``raw_input_contents`` (each element: 4-byte little-endian length, then the bytes)."""
    import struct

    from tritonclient.grpc import service_pb2

    payloads = []
    for j in range(len(texts)):
        request = service_pb2.ModelInferRequest(model_name=model)
        tensor = request.inputs.add(name="TEXT", datatype="BYTES")
        tensor.shape.extend([bulk, 1])
        request.outputs.add(name="EMBEDDING")
        chunk = [texts[(j + k) % len(texts)].encode() for k in range(bulk)]
        request.raw_input_contents.append(b"".join(struct.pack("<I", len(t)) + t for t in chunk))
        payloads.append(request.SerializeToString())
    return payloads


def _worker(url: str, model: str, texts: list[str], concurrency: int, duration_s: float, bulk: int, queue,
            client_kind: str = "tritonclient") -> None:
    """One load process: ``concurrency`` threads, each with its own synchronous gRPC client.

    ``client_kind``: ``tritonclient`` (``tritonclient.grpc.InferenceServerClient.infer``: builds
    ``InferInput`` s, serializes, parses the response into numpy) or ``grpc-raw`` (a lean client
    in the spirit of perf_analyzer, the served benchmarks' load (benchmarks/perf_analyzer.py): pre-serialized
    ``ModelInferRequest`` bytes sent over a plain grpcio channel, responses checked for an OK status
    and a non-empty output, and every 64th parsed and its EMBEDDING shape checked), so the load
    generator takes less of the host's CPU. (tritonclient.grpc.aio requests hung in spawned
    processes on the device machine's grpcio; the synchronous clients in threads work there and
    release the GIL while waiting.)
    """
    import threading

    import grpc
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2

    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    deadline = time.monotonic() + duration_s

    payloads = raw_infer_payloads(model, texts, bulk) if client_kind == "grpc-raw" else []

    def raw_client():
        """(prepare, send, close) of the lean client: prepare picks a pre-serialized request."""
        channel = grpc.insecure_channel(url, options=[("grpc.max_receive_message_length", 64 << 20)])
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        sent = [0]

        def send(payload: bytes) -> None:
            reply = call(payload, timeout=20.0)
            sent[0] += 1
            if sent[0] % 64 == 1:
                response = service_pb2.ModelInferResponse.FromString(reply)
                if list(response.outputs[0].shape) != [bulk, 384] or len(response.raw_output_contents[0]) != bulk * 384 * 4:
                    raise RuntimeError(f"bad response: {response.outputs[0]}")
            elif len(reply) < bulk * 384 * 4:
                raise RuntimeError(f"short response of {len(reply)} bytes")

        return (lambda j: payloads[j % len(payloads)]), send, channel.close

    def tritonclient_client():
        """(prepare, send, close) of tritonclient: prepare builds the InferInput (outside the timing)."""
        client = grpcclient.InferenceServerClient(url)
        output = [grpcclient.InferRequestedOutput("EMBEDDING")]

        def prepare(j: int) -> Any:
            tensor = grpcclient.InferInput("TEXT", [bulk, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[texts[(j + k) % len(texts)].encode()] for k in range(bulk)], dtype=np.object_))
            return tensor

        return prepare, (lambda tensor: client.infer(model, [tensor], outputs=output, client_timeout=20.0)), client.close

    def loop(index: int) -> None:
        prepare, send, close = raw_client() if client_kind == "grpc-raw" else tritonclient_client()
        i = index
        local: list[float] = []
        while time.monotonic() < deadline:
            request = prepare(i)
            i += concurrency * bulk
            start = time.perf_counter()
            try:
                send(request)
                local.append(time.perf_counter() - start)
            except Exception as exc:
                with lock:
                    errors[0] += 1
                    if errors[0] <= 3:
                        print("load error:", str(exc)[:300], flush=True)
        with lock:
            latencies.extend(local)
        close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
    cpu_start = time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put((latencies, errors[0], time.process_time() - cpu_start))


def load(url: str, texts: list[str], concurrency: int, duration_s: float, bulk: int = 1, processes: int = 8,
         model: str = "text_embedding", server_pid: int | None = None, spy: tuple[float, Path] | None = None,
         client_kind: str = "tritonclient") -> dict:
    processes = max(1, min(processes, concurrency))
    shares = [concurrency // processes + (1 if i < concurrency % processes else 0) for i in range(processes)]
    queue = mp.get_context("spawn").Queue()
    workers = [mp.get_context("spawn").Process(target=_worker, args=(url, model, texts[i::processes], share, duration_s, bulk, queue,
                                                                      client_kind))
               for i, share in enumerate(shares)]
    account = CpuAccount(server_pid)
    started = time.monotonic()
    for worker in workers:
        worker.start()
    spying = None
    if spy:
        time.sleep(min(1.0, duration_s / 4))  # past the ramp-up
        spying = start_py_spy(model, spy[0], spy[1])
    results = []
    for _ in workers:
        try:
            results.append(queue.get(timeout=duration_s + 60))
        except Exception:  # a worker that hung or died: reported, not fatal
            results.append(([], -1, 0.0))
    wall_s = time.monotonic() - started
    for worker in workers:
        worker.join(30)
    latencies = np.array([x for lat, _, _ in results for x in lat])
    errors = sum(e for _, e, _ in results)
    cpu = account.finish(int(latencies.size), sum(c for _, _, c in results), wall_s)
    profile = None
    if spying is not None:
        spying.wait(timeout=60)
        profile = summarize_py_spy(spy[1])
    return {"model": model, "client": client_kind, "concurrency": concurrency, "bulk": bulk, "requests": int(latencies.size),
            "errors": errors, "cpu": cpu,
            **({"py_spy": profile} if profile else {}),
            "req_per_s": round(latencies.size / duration_s, 1), "texts_per_s": round(latencies.size * bulk / duration_s, 1),
            "p50_ms": round(float(np.percentile(latencies, 50)) * 1e3, 3) if latencies.size else None,
            "p99_ms": round(float(np.percentile(latencies, 99)) * 1e3, 3) if latencies.size else None}
