"""What the benchmark's own gRPC client costs at concurrency 32, and what the server gets back when it costs less.

Run from the repository root with the artifacts built (about 3 minutes on a 2-core machine):

    .venv/bin/python scripts/client_cost_probe.py

benchmarks/scheduler_cpu.py runs its closed-loop clients in its own process on the same two cores as
tritonserver and its stubs, so every CPU second the client spends is taken from the served model and
not from the raw engine it is compared with. This probe serves ``--models`` (default the shipped
``text_embedding`` and the ``naive_embedding`` baseline) from one tritonserver and alternates c=32
slices of three clients, all one text per request over gRPC (grpc.aio underneath):

    tritonclient      tritonclient.grpc.aio as scheduler_cpu.py uses it: InferInput per request, every output
    tritonclient_emb  the same, asking only for EMBEDDING (InferRequestedOutput), as an embedding service would
    prebuilt          tritonclient's own protobuf messages (tritonclient.grpc.service_pb2) serialized once
                      per text, sent on a grpc.aio channel; every response parsed (ModelInferResponse)
                      and its EMBEDDING read as float32 [1, 384] -- what a C++ load generator such as
                      Triton's perf_analyzer does (it prepares its requests before the run)

and prints, per client and model: texts/s, the client's CPU ms per request (this process), the
server tree's CPU ms per request (tritonserver and its stubs) and the other processes' cores.
The order of the clients alternates every pass; ratios within a pass are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "benchmarks"))

CLIENTS = ("tritonclient", "tritonclient_emb", "prebuilt")


def bytes_tensor(texts: list[bytes]) -> bytes:
    """Triton's BYTES wire format: each element as a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(text)) + text for text in texts)


def prebuilt_requests(model: str, texts: list[str], only_embedding: bool = True) -> list[bytes]:
    """One serialized ``inference.ModelInferRequest`` per text: TEXT BYTES [1, 1] in raw_input_contents."""
    from tritonclient.grpc import service_pb2

    out = []
    for text in texts:
        request = service_pb2.ModelInferRequest(model_name=model)
        tensor = request.inputs.add()
        tensor.name, tensor.datatype = "TEXT", "BYTES"
        tensor.shape.extend([1, 1])
        if only_embedding:
            request.outputs.add().name = "EMBEDDING"
        request.raw_input_contents.append(bytes_tensor([text.encode()]))
        out.append(request.SerializeToString())
    return out


class Loop:
    """Closed-loop c clients for ``seconds`` (+ warm-up) with one of :data:`CLIENTS`."""

    def __init__(self, url: str, texts: list[str], models: list[str]) -> None:
        import grpc
        import tritonclient.grpc.aio as grpcaio
        from tritonclient.grpc import service_pb2

        self.grpcaio, self.pb = grpcaio, service_pb2
        self.client = grpcaio.InferenceServerClient(url)
        self.channel = grpc.aio.insecure_channel(url, options=[("grpc.max_receive_message_length", -1)])
        self.infer = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")  # bytes in, bytes out
        self.texts = texts
        self.requests = {model: prebuilt_requests(model, texts) for model in models}
        self.cursor = 0

    async def close(self) -> None:
        await self.client.close()
        await self.channel.close()

    async def one(self, kind: str, model: str, index: int) -> None:
        if kind == "prebuilt":
            reply = self.pb.ModelInferResponse.FromString(await self.infer(self.requests[model][index]))
            embedding = np.frombuffer(reply.raw_output_contents[0], dtype=np.float32).reshape(1, 384)
            assert np.isfinite(embedding).all()
            return
        tensor = self.grpcaio.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[self.texts[index].encode()]], dtype=np.object_))
        outputs = [self.grpcaio.InferRequestedOutput("EMBEDDING")] if kind == "tritonclient_emb" else None
        result = await self.client.infer(model, [tensor], outputs=outputs)
        assert np.isfinite(result.as_numpy("EMBEDDING")).all()

    async def run(self, kind: str, model: str, concurrency: int, warmup_s: float, seconds: float) -> dict:
        begin = time.perf_counter()
        window = (begin + warmup_s, begin + warmup_s + seconds)
        state = {"done": 0, "errors": 0}
        me = psutil.Process()
        marks: dict[str, tuple] = {}

        async def worker() -> None:
            while (now := time.perf_counter()) < window[1]:
                if now >= window[0] and "start" not in marks:
                    marks["start"] = snapshot(me)
                index = self.cursor % len(self.texts)
                self.cursor += 1
                try:
                    await self.one(kind, model, index)
                except Exception as error:  # noqa: BLE001 - counted and shown
                    state["errors"] += 1
                    state["last_error"] = str(error)[:200]
                    continue
                if window[0] <= time.perf_counter() <= window[1]:
                    state["done"] += 1
            if "end" not in marks:
                marks["end"] = snapshot(me)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        (w0, c0, s0, b0), (w1, c1, s1, b1) = marks["start"], marks["end"]
        done = max(state["done"], 1)
        return {"texts_per_s": state["done"] / seconds, "client_ms": 1e3 * (c1 - c0) / done,
                "server_ms": 1e3 * (s1 - s0) / done,
                "other_cores": max((b1 - b0) - (c1 - c0) - (s1 - s0), 0.0) / (w1 - w0),
                "errors": state["errors"], **({"last_error": state["last_error"]} if "last_error" in state else {})}


def snapshot(me: psutil.Process) -> tuple[float, float, float, float]:
    """(wall s, this process's CPU s, its children's CPU s, system busy CPU s), from benchmarks/cpu_meter.py."""
    from cpu_meter import CpuMeter, cpu_seconds

    wall, busy, tree, _ = CpuMeter().sample()
    own = cpu_seconds(me)
    return wall, own, tree - own, busy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["text_embedding", "naive_embedding"])
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    args = parser.parse_args(argv)

    from conftest import start_server
    from scheduler_cpu import build_repository, workload_texts

    texts = workload_texts()
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="fastpath-client-") as tmp:
        server = start_server(Path(tmp), models=tuple(args.models), repository=build_repository(Path(tmp)))
        try:
            async def passes() -> None:
                loop = Loop(server.grpc_url, texts, args.models)
                try:
                    for number in range(args.passes):
                        order = args.clients if number % 2 == 0 else args.clients[::-1]
                        for model in args.models:
                            for kind in order:
                                cell = await loop.run(kind, model, args.concurrency, args.warmup_s, args.seconds)
                                results.setdefault((model, kind), []).append(cell)
                                print(f"pass {number} {model:16s} {kind:17s} {cell['texts_per_s']:7.1f} texts/s  "
                                      f"client {cell['client_ms']:.3f} ms/req  server {cell['server_ms']:.3f} ms/req  "
                                      f"other {cell['other_cores']:.2f} cores  errors {cell['errors']}"
                                      + (f" ({cell['last_error']})" if cell["errors"] else ""), flush=True)
                finally:
                    await loop.close()

            asyncio.run(passes())
        finally:
            server.stop()
    print(f"\nc={args.concurrency}, {args.passes} passes of {args.seconds:g} s; medians over passes; "
          f"'vs tritonclient' compares texts/s within each pass, then takes the median")
    print("| model | client | texts/s | vs tritonclient | client CPU ms/req | server CPU ms/req |")
    print("|---|---|---:|---:|---:|---:|")
    for model in args.models:
        for kind in args.clients:
            cells = results[(model, kind)]
            base = results.get((model, "tritonclient"), cells)
            ratio = statistics.median(c["texts_per_s"] / b["texts_per_s"] for c, b in zip(cells, base))
            print(f"| {model} | {kind} | {statistics.median(c['texts_per_s'] for c in cells):.1f} | {ratio:.3f} | "
                  f"{statistics.median(c['client_ms'] for c in cells):.3f} | "
                  f"{statistics.median(c['server_ms'] for c in cells):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
