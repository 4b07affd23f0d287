"""Does any request wait behind sustained load? Lone, timed and bursty requests against the served scheduler.

Run from the repository root with the artifacts built:

    .venv/bin/python scripts/fairness_probe.py

Starts one tritonserver serving the shipped ``text_embedding`` (its config.pbtxt as shipped) and runs
three scenarios with tritonclient HTTP, each printing a short table (no goals; what a user sees):

1. ``lone``: ``--load-clients`` (8) closed-loop clients each send 64 copies of one ~20-token text,
   keeping one length bucket full (512 texts queued at most, under ``max_queue_texts`` 1024); after
   3 s, one 2-token text and one ~230-token text are sent once. Their latencies against the load's
   (the load stops after ``--load-limit-s`` if they have not come back by then).
2. ``timed``: the same load; single short texts with Triton ``timeout`` 3 s and 0.3 s, alternating,
   six of each: how many ran, and when the others got their 503 (at their timeout, or later).
3. ``burst``: 12 requests of 64 texts (60 of ~20 tokens, 4 of ~100: a rarer length bucket), sent
   50 ms apart on an idle server: when each one finishes.

Found by a fresh-user trial (2026-11-30, eighth session: lone texts waited 41 s, 3 s timeouts
expired 5 of 6 times, the burst finished all at once at the end); the fixed rules are in
docs/design/scheduler.md ("Fairness under sustained load"). The numbers move with the machine; the
shape of them (seconds, not tens of seconds; answers at the timeout) is what to read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "triton", "server", "batch", "queue", "embedding", "model", "python", "backend", "scheduler", "token", "bucket", "padding", "latency", "throughput"]


def text_of(words: int, seed: int) -> str:
    """A text of ``words`` words from a fixed vocabulary (about one token per word)."""
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=words))


def infer(url: str, texts: list[str], timeout_us: int = 0) -> tuple[str, float]:
    """('ok' or the error text, seconds) of one HTTP request of ``texts``."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, network_timeout=300, connection_timeout=300)
    tensor = httpclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    start = time.perf_counter()
    try:
        client.infer("text_embedding", [tensor], outputs=[httpclient.InferRequestedOutput("EMBEDDING")],
                     **({"timeout": timeout_us} if timeout_us else {}))
        return "ok", time.perf_counter() - start
    except Exception as exc:  # the 503s are what scenario 2 reports
        return str(exc).split(";")[0][:90], time.perf_counter() - start
    finally:
        client.close()


class Load:
    """``clients`` closed-loop clients, each sending 64 copies of one ~20-token text until stopped."""

    def __init__(self, url: str, clients: int) -> None:
        self.url, self.stop, self.latencies = url, threading.Event(), []
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(clients)]

    def _run(self, seed: int) -> None:
        text = text_of(18, seed)
        while not self.stop.is_set():
            result, seconds = infer(self.url, [text] * 64)
            if result == "ok":
                self.latencies.append(seconds)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        time.sleep(3.0)  # the bucket is full and stays full
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load-clients", type=int, default=8)
    parser.add_argument("--load-limit-s", type=float, default=40.0,
                        help="scenario 1 stops its load after this long even if the probes have not come back")
    args = parser.parse_args(argv)
    from conftest import start_server

    with tempfile.TemporaryDirectory(prefix="fastpath-fairness-") as tmp:
        server = start_server(Path(tmp), models=("text_embedding",))
        url = server.http_url.removeprefix("http://")
        try:
            with Load(url, args.load_clients) as load:
                stopper = threading.Timer(args.load_limit_s, load.stop.set)  # starved probes come back once it stops
                stopper.start()
                with ThreadPoolExecutor(2) as pool:
                    probes = list(pool.map(lambda text: infer(url, [text]), ["hi", text_of(200, 99)]))
                stopper.cancel()
            print(f"1. lone texts under {args.load_clients} clients x 64 texts of one length")
            print("| request | result | latency s |\n|---|---|---:|")
            for name, (result, seconds) in zip(("2-token text", "~230-token text"), probes):
                print(f"| {name} | {result} | {seconds:.2f} |")
            print(f"| load (median of {len(load.latencies)}) | ok | {statistics.median(load.latencies):.2f} |\n")

            with Load(url, args.load_clients):  # each probe ends by its timeout at the latest
                timed = [(timeout_us, *infer(url, ["hi there"], timeout_us)) for _ in range(6)
                         for timeout_us in (3_000_000, 300_000)]
            print("2. timed single texts under the same load")
            print("| timeout s | ran | answered 503 | latency s (max) |\n|---:|---:|---:|---:|")
            for timeout_us in (3_000_000, 300_000):
                rows = [(result, seconds) for t, result, seconds in timed if t == timeout_us]
                print(f"| {timeout_us / 1e6:g} | {sum(r == 'ok' for r, _ in rows)} | {sum('timeout expired' in r for r, _ in rows)} "
                      f"| {max(s for _, s in rows):.2f} |")

            requests = [[text_of(18, 1000 + 64 * k + j) for j in range(60)] + [text_of(95, 5000 + 4 * k + j) for j in range(4)]
                        for k in range(12)]
            begin = time.perf_counter()

            def send(k: int) -> tuple[int, float, float]:
                time.sleep(0.05 * k)
                sent = time.perf_counter() - begin
                infer(url, requests[k])
                return k, sent, time.perf_counter() - begin

            with ThreadPoolExecutor(12) as pool:
                done = list(pool.map(send, range(12)))
            print("\n3. 12 requests of 64 texts (60 x ~20 tokens, 4 x ~100), 50 ms apart, idle server")
            print("| request | sent s | done s |\n|---:|---:|---:|")
            for k, sent, finished in done:
                print(f"| {k} | {sent:.2f} | {finished:.2f} |")
            print(f"mean latency {statistics.fmean(f - s for _, s, f in done):.2f} s")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
