"""Baseline python-backend models for benchmarks/scheduler_cpu.py (benchmark code, not product code).

    naive_embedding      no Triton batching; ``execute`` runs one engine call per request.
    stack_pad_embedding  Triton's dynamic batcher; a blocking ``execute`` stacks every request's
                         texts and pads them to the longest, one engine call per ``execute``.
    echo_embedding       no engine: zero embeddings, to measure Triton's own per-request overhead.
    floor_embedding      no engine, behind Triton's dynamic batcher: reads every request's TEXT,
                         tokenizes all texts of an ``execute()`` in one tokenizer call and answers
                         zeros: the python backend's ceiling for a model that must read and tokenize.
    raw_engine_bench     not a serving model: one request carries a sample of texts and a ``mode``
                         parameter; the stub runs the raw engine loop on them (:func:`measure_raw`)
                         and returns the timings, so raw and served variants run in the same kind
                         of process (a python-backend stub) on this shared machine.

All three answer TEXT -> EMBEDDING / TOKEN_COUNT / TRUNCATED like ``text_embedding``, with the same
tokenizer, ONNX artifact and ONNX Runtime settings, and count padded and real tokens in the custom
metrics ``bench_padded_tokens_total`` / ``bench_real_tokens_total``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from fastpath.config import parse_parameters, triton_parameters
from fastpath.models.text_embedding.config import TextEmbeddingConfig
from fastpath.models.text_embedding.pipeline import EMBEDDING_DIM, TextEmbedder
from fastpath.profiling import PROFILE
from fastpath.text import decode_texts, set_tokenizer_parallelism
from fastpath.triton.io import error_response, read_input
from fastpath.triton.watchdog import exit_with_server


def measure_raw(tokenizer: Any, engine: Any, mode: str, texts: list[str], gap_s: float = 0.0) -> tuple[float, int, int, list[float]]:
    """Tokenize + pad + run ``texts`` without any serving path.

    Modes: ``raw_ideal`` (batches of 64 in the given order, each padded to its longest; the caller
    passes length-sorted runs), ``raw_arrival_64`` (batches of 64 in arrival order, padded to the
    longest), ``raw_batch_1`` (one text per engine call, back to back), ``raw_call`` (one text per
    engine call, each after ``gap_s`` seconds idle: a single call as a served request at
    concurrency 1 meets the engine, idle for the client's round trip since the last one).

    Returns:
        (elapsed seconds, not counting the gaps; padded tokens, real tokens, per-call seconds for
        raw_batch_1 and raw_call).
    """
    import time

    output = engine.outputs[0].name
    calls: list[float] = []
    padded = 0
    single = mode in ("raw_batch_1", "raw_call")
    groups = [[text] for text in texts] if single else [texts[k : k + 64] for k in range(0, len(texts), 64)]
    real = 0
    idle = 0.0
    start = time.perf_counter()
    for group in groups:
        if mode == "raw_call":
            idle_start = time.perf_counter()
            time.sleep(gap_s)
            idle += time.perf_counter() - idle_start
        call_start = time.perf_counter()
        encodings = tokenizer.encode(group)
        length = max(len(e.ids) for e in encodings)
        engine.infer(tokenizer.pad(encodings, length).feeds())[output]
        calls.append(time.perf_counter() - call_start)
        padded += length * len(encodings)
        real += sum(len(e.ids) for e in encodings)
    return time.perf_counter() - start - idle, padded, real, calls if single else []


class BaselineEmbeddingModel:
    """Subclasses set ``mode``: ``"naive"`` | ``"stack"`` | ``"echo"`` | ``"raw"``."""

    mode = "naive"

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb

        self.pb = pb
        # A stub outlives a killed tritonserver (Triton 2.51); one left from an interrupted benchmark run keeps
        # ~0.1 core busy under the next one. FastPath's models exit with the server.
        exit_with_server()
        self.profile_name = args.get("model_instance_name", args["model_name"])
        self.config = parse_parameters(TextEmbeddingConfig, triton_parameters(json.loads(args["model_config"])))
        set_tokenizer_parallelism(self.config.tokenizer_parallelism)  # the same tokenizer settings as text_embedding
        self.embedder = TextEmbedder.from_directory(Path(args["model_repository"]) / args["model_version"], self.config)
        labels = {"model": args["model_name"]}
        try:
            self._families = [pb.MetricFamily(name=f"bench_{kind}_tokens_total", description=f"{kind} tokens",
                                              kind=pb.MetricFamily.COUNTER) for kind in ("padded", "real")]
            self.padded_tokens, self.real_tokens = (family.Metric(labels=labels) for family in self._families)
        except Exception:  # the server runs with --allow-metrics=false
            self._families, self.padded_tokens, self.real_tokens = [], None, None

    def _run(self, encodings: list[Any]) -> np.ndarray:
        """One engine call, padded to the longest text: float32 [len(encodings), 384]."""
        length = max(len(e.ids) for e in encodings)
        if self.padded_tokens is not None:
            self.padded_tokens.increment(float(length * len(encodings)))
            self.real_tokens.increment(float(sum(len(e.ids) for e in encodings)))
        if self.mode == "echo":
            return np.zeros((len(encodings), EMBEDDING_DIM), dtype=np.float32)
        feeds = self.embedder.tokenizer.pad(encodings, length).feeds()
        return self.embedder.engine.infer(feeds)[self.embedder.engine.outputs[0].name]

    def _response(self, embeddings: np.ndarray, encodings: list[Any]) -> Any:
        pb = self.pb
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor("EMBEDDING", np.ascontiguousarray(embeddings, dtype=np.float32)),
            pb.Tensor("TOKEN_COUNT", np.array([[len(e.ids)] for e in encodings], dtype=np.int32)),
            pb.Tensor("TRUNCATED", np.array([[len(e.overflowing) > 0] for e in encodings], dtype=np.bool_)),
        ])

    def execute(self, requests: list[Any]) -> list[Any]:
        if self.mode == "raw":
            return [self._raw(request) for request in requests]
        if self.mode == "floor":
            return self._floor(requests)
        started = mark = PROFILE.start()
        responses: list[Any] = [None] * len(requests)
        batches: list[tuple[int, list[Any]]] = []
        for index, request in enumerate(requests):
            try:
                texts = decode_texts(read_input(self.pb, request, "TEXT"), tensor="TEXT",
                                     max_text_bytes=self.config.max_text_bytes)
                batches.append((index, self.embedder.tokenizer.encode(texts)))
            except Exception as exc:
                responses[index] = error_response(self.pb, exc)
        mark = PROFILE.lap("execute.decode_and_tokenize", mark, len(requests))
        if self.mode == "stack" and batches:
            stacked = [e for _, encodings in batches for e in encodings]
            embeddings = self._run(stacked)
            mark = PROFILE.lap("scheduler.run", mark)
            start = 0
            for index, encodings in batches:
                responses[index] = self._response(embeddings[start : start + len(encodings)], encodings)
                start += len(encodings)
            PROFILE.lap("respond", mark, len(batches))
        else:
            for index, encodings in batches:
                embeddings = self._run(encodings)
                mark = PROFILE.lap("engine.infer", mark)
                responses[index] = self._response(embeddings, encodings)
                mark = PROFILE.lap("respond", mark)
        if PROFILE.enabled:
            PROFILE.lap("execute.total", started, len(requests))
            PROFILE.dump(self.profile_name, force=False)
        return responses

    def _floor(self, requests: list[Any]) -> list[Any]:
        """Read and decode each request, tokenize every text of the call in one call, answer zeros."""
        responses: list[Any] = [None] * len(requests)
        spans, texts = [], []
        for index, request in enumerate(requests):
            try:
                decoded = decode_texts(read_input(self.pb, request, "TEXT"), tensor="TEXT", max_text_bytes=self.config.max_text_bytes)
            except Exception as exc:
                responses[index] = error_response(self.pb, exc)
                continue
            spans.append((index, len(texts), len(texts) + len(decoded)))
            texts.extend(decoded)
        encodings = self.embedder.tokenizer.encode(texts) if texts else []
        zeros = np.zeros((len(texts), EMBEDDING_DIM), dtype=np.float32)
        for index, first, end in spans:
            responses[index] = self._response(zeros[first:end], encodings[first:end])
        return responses

    def _raw(self, request: Any) -> Any:
        pb = self.pb
        texts = decode_texts(read_input(pb, request, "TEXT"), tensor="TEXT", max_text_bytes=self.config.max_text_bytes)
        parameters = json.loads(request.parameters() or "{}")
        mode = parameters.get("mode", "raw_ideal")
        elapsed, padded, real, calls = measure_raw(self.embedder.tokenizer, self.embedder.engine, mode, texts,
                                                   gap_s=float(parameters.get("gap_us", 0)) * 1e-6)
        return pb.InferenceResponse(output_tensors=[
            pb.Tensor("STATS", np.array([elapsed, padded, real], dtype=np.float64)),
            pb.Tensor("CALL_S", np.array(calls or [0.0], dtype=np.float64)),
        ])

    def finalize(self) -> None:
        PROFILE.dump(self.profile_name)
        self.embedder.close()
