"""Load test of the retrieval server: mixed valid and invalid traffic, no 5xx allowed.

Starts ``agentr1 serve retriever`` (BM25 by default) as a separate process bound to
127.0.0.1, over a JSONL corpus or a built-in synthetic one, then N client threads send a
fixed, seeded mix of requests: ~80 % valid (1-4 queries, top_k 1-10) and ~20 % invalid
(empty or blank query, huge query, top_k 0 / 1000, wrong types, empty or oversized batch,
malformed JSON, unknown field, a body over the server's byte limit).

It checks that every request is answered, none with a 5xx, every invalid one with a 4xx
and every valid one with a 200 holding one result list per query, at most top_k long. It
prints latency p50/p90/p99/max and throughput, and exits 1 if a check fails.

    python benchmarks/server_load.py                       # 8 clients, 2,000 requests
    python benchmarks/server_load.py --clients 4 --requests 200 --json runs/load.json
    python benchmarks/server_load.py --corpus passages.jsonl --kind bm25

All traffic goes to 127.0.0.1; the run is bounded by ``--requests`` and ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MAX_QUERY_CHARS = 1000
MAX_TOP_K = 50
MAX_BATCH = 64


@dataclass(frozen=True)
class Spec:
    """One request to send.

    Attributes:
        kind: "valid" or the name of the invalid case.
        body: raw request bytes (JSON, or deliberately malformed).
        n_queries: queries in a valid request (0 for invalid ones).
        top_k: requested top_k of a valid request.
    """

    kind: str
    body: bytes
    n_queries: int = 0
    top_k: int = 0

    @property
    def valid(self) -> bool:
        return self.kind == "valid"


@dataclass
class Outcome:
    """What came back for one request: status (0: no answer), latency, a problem if any."""

    kind: str
    status: int
    latency_s: float
    problem: str = ""


@dataclass
class Report:
    """The results written by ``--json``."""

    requests: int
    answered: int
    clients: int
    corpus_size: int
    kind: str
    wall_s: float
    throughput_rps: float
    status_counts: dict[str, int]
    latency_ms: dict[str, dict[str, float]]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def synthetic_corpus(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` passages of 30-60 pseudo-words from a 3,000-word vocabulary (Zipf-like)."""
    rng = random.Random(seed)
    syll = ["ka", "lo", "mi", "ren", "tu", "sa", "vel", "dor", "ni", "qua", "zo", "ber", "is"]
    vocab = sorted({"".join(rng.choices(syll, k=rng.randint(2, 4))) for _ in range(3000)})
    weights = [1 / (r + 1) for r in range(len(vocab))]
    return [
        {
            "id": f"doc{i}",
            "title": " ".join(rng.choices(vocab, weights, k=2)).title(),
            "text": " ".join(rng.choices(vocab, weights, k=rng.randint(30, 60))),
        }
        for i in range(n)
    ]


def make_specs(n: int, words: list[str], invalid_frac: float, seed: int) -> list[Spec]:
    """A seeded mix of valid and invalid requests (see the module docstring)."""
    rng = random.Random(seed)

    def query() -> str:
        return " ".join(rng.choices(words, k=rng.randint(1, 6)))

    def dumps(obj: Any) -> bytes:
        return json.dumps(obj).encode()

    invalid: dict[str, Any] = {
        "empty_query": lambda: dumps({"queries": [query(), ""], "top_k": 3}),
        "blank_query": lambda: dumps({"queries": ["  \t "], "top_k": 3}),
        "huge_query": lambda: dumps({"queries": ["x" * rng.randint(MAX_QUERY_CHARS + 1, 20_000)]}),
        "top_k_0": lambda: dumps({"queries": [query()], "top_k": 0}),
        "top_k_1000": lambda: dumps({"queries": [query()], "top_k": 1000}),
        "top_k_str": lambda: dumps({"queries": [query()], "top_k": "5"}),
        "queries_str": lambda: dumps({"queries": query(), "top_k": 3}),
        "queries_ints": lambda: dumps({"queries": [1, 2], "top_k": 3}),
        "empty_batch": lambda: dumps({"queries": [], "top_k": 3}),
        "batch_too_big": lambda: dumps({"queries": [query()] * (MAX_BATCH + 1), "top_k": 3}),
        "malformed_json": lambda: b'{"queries": ["abc", }',
        "unknown_field": lambda: dumps({"queries": [query()], "top_k": 3, "k": 3}),
        "not_an_object": lambda: dumps([query()]),
        "body_too_large": lambda: dumps({"queries": ["y" * 800_000]}),
    }
    names = sorted(invalid)
    specs = []
    for _ in range(n):
        if rng.random() < invalid_frac:
            name = rng.choice(names)
            specs.append(Spec(name, invalid[name]()))
        else:
            qs = [query() for _ in range(rng.randint(1, 4))]
            k = rng.randint(1, 10)
            specs.append(Spec("valid", dumps({"queries": qs, "top_k": k}), len(qs), k))
    return specs


def free_port() -> int:
    """A port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(corpus: Path, kind: str, port: int, timeout_s: float) -> subprocess.Popen[bytes]:
    """``agentr1 serve retriever`` in its own process; returns once /health answers."""
    import httpx

    cmd = [sys.executable, "-m", "agentr1.cli", "serve", "retriever", "--corpus", str(corpus)]
    cmd += ["--kind", kind, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--max-batch", str(MAX_BATCH), "--max-query-chars", str(MAX_QUERY_CHARS)]
    cmd += ["--max-top-k", str(MAX_TOP_K)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}: {' '.join(cmd)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop_server(proc)
    raise RuntimeError(f"server did not answer /health within {timeout_s:g} s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def check(spec: Spec, status: int, body: bytes) -> str:
    """Why this answer is wrong for this request ("" when it is right)."""
    try:
        return _check(spec, status, body)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"HTTP {status} with an unreadable body ({e}): {body[:100]!r}"


def _check(spec: Spec, status: int, body: bytes) -> str:
    if status == 0:
        return "no answer"
    if status >= 500:
        return f"HTTP {status}: {body[:200]!r}"
    if not spec.valid:
        if not 400 <= status < 500:
            return f"invalid request answered {status}"
        msg = json.loads(body).get("message", "")
        return "" if msg else "4xx without a message"
    if status != 200:
        return f"valid request answered {status}: {body[:200]!r}"
    results = json.loads(body)["results"]
    if len(results) != spec.n_queries or any(len(r) > spec.top_k for r in results):
        return "wrong result shape"
    return ""


def run_clients(
    url: str, specs: list[Spec], clients: int, timeout_s: float, deadline_s: float
) -> tuple[list[Outcome], float]:
    """Send ``specs`` from ``clients`` threads (one keep-alive connection each)."""
    import httpx

    outcomes: list[Outcome | None] = [None] * len(specs)
    next_i = iter(range(len(specs)))
    lock = threading.Lock()
    stop_at = time.monotonic() + deadline_s

    def worker() -> None:
        with httpx.Client(timeout=timeout_s) as client:
            while time.monotonic() < stop_at:
                with lock:
                    i = next(next_i, None)
                if i is None:
                    return
                spec = specs[i]
                t0 = time.perf_counter()
                try:
                    r = client.post(
                        f"{url}/retrieve",
                        content=spec.body,
                        headers={"content-type": "application/json"},
                    )
                    status, body = r.status_code, r.content
                except httpx.HTTPError as e:
                    status, body = 0, str(e).encode()
                latency = time.perf_counter() - t0
                outcomes[i] = Outcome(spec.kind, status, latency, check(spec, status, body))

    threads = [threading.Thread(target=worker, name=f"client{c}") for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return [o for o in outcomes if o is not None], wall


def percentiles_ms(latencies_s: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max / mean in milliseconds."""
    if not latencies_s:
        return {}
    xs = sorted(latencies_s)

    def pct(p: float) -> float:
        return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))] * 1000

    return {
        "p50": pct(50),
        "p90": pct(90),
        "p99": pct(99),
        "max": xs[-1] * 1000,
        "mean": statistics.fmean(xs) * 1000,
    }


def summarize(
    specs: list[Spec], outcomes: list[Outcome], wall: float, clients: int, n: int, kind: str
) -> Report:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[str(o.status)] = counts.get(str(o.status), 0) + 1
    problems = [f"{o.kind}: {o.problem}" for o in outcomes if o.problem]
    if len(outcomes) != len(specs):
        problems.insert(0, f"only {len(outcomes)} of {len(specs)} requests were sent")
    return Report(
        requests=len(specs),
        answered=sum(o.status != 0 for o in outcomes),
        clients=clients,
        corpus_size=n,
        kind=kind,
        wall_s=wall,
        throughput_rps=len(outcomes) / wall if wall else 0.0,
        status_counts=dict(sorted(counts.items())),
        latency_ms={
            "all": percentiles_ms([o.latency_s for o in outcomes]),
            "valid": percentiles_ms([o.latency_s for o in outcomes if o.kind == "valid"]),
            "invalid": percentiles_ms([o.latency_s for o in outcomes if o.kind != "valid"]),
        },
        problems=problems[:50],
    )


def print_report(r: Report) -> None:
    print(
        f"{r.requests} requests from {r.clients} clients, {r.kind} over {r.corpus_size} passages: "
        f"{r.answered} answered in {r.wall_s:.2f} s ({r.throughput_rps:.0f} req/s)"
    )
    print("status counts:", r.status_counts)
    for name, lat in r.latency_ms.items():
        if lat:
            cells = "  ".join(f"{k} {v:7.1f}" for k, v in lat.items())
            print(f"latency ms  {name:8s} {cells}")
    print("OK" if r.ok else f"FAILED: {len(r.problems)} problem(s), e.g. {r.problems[:5]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--corpus", type=Path, help="JSONL of {id, title, text}; default: synthetic")
    ap.add_argument("--synthetic-size", type=int, default=5000, help="passages when synthetic")
    ap.add_argument("--kind", default="bm25", choices=["bm25", "dense", "hybrid"])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--invalid-frac", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout-s", type=float, default=30.0, help="per request")
    ap.add_argument("--deadline-s", type=float, default=600.0, help="for the whole run")
    ap.add_argument("--startup-s", type=float, default=120.0, help="for the server to start")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="agentr1-load-") as tmp:
        corpus = args.corpus
        if corpus is None:
            corpus = Path(tmp) / "corpus.jsonl"
            records = synthetic_corpus(args.synthetic_size, args.seed)
            corpus.write_text("".join(json.dumps(r) + "\n" for r in records))
        else:
            records = [json.loads(line) for line in corpus.open() if line.strip()]
        words = sorted({w for r in records[:2000] for w in r["text"].split()})
        specs = make_specs(args.requests, words, args.invalid_frac, args.seed)
        port = free_port()
        proc = start_server(corpus, args.kind, port, args.startup_s)
        try:
            url = f"http://127.0.0.1:{port}"
            outcomes, wall = run_clients(url, specs, args.clients, args.timeout_s, args.deadline_s)
        finally:
            stop_server(proc)
    report = summarize(specs, outcomes, wall, args.clients, len(records), args.kind)
    print_report(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(asdict(report) | {"ok": report.ok}, indent=2) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
