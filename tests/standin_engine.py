"""A stand-in OpenAI-compatible engine whose step time follows a formula the test chooses.

It serves what `sovereignspec profile` reads from vLLM: `GET /v1/models`, streaming
`POST /v1/completions` (token-id or text prompts, `max_tokens`, one SSE chunk per request per step)
and `GET /metrics` with `vllm:num_requests_running` and `vllm:kv_cache_usage_perc`. One engine
thread runs continuous batching: new requests are prefilled together in one step, then every
running request decodes one token per step; steps are scheduled on absolute deadlines, so the
work of handing tokens out does not add to the step time clients see. `GET /stand-in/steps` gives
the decode steps it really took (and starts a fresh log), for tests that hold a measurement to them.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

StepTime = Callable[[float, float, float], float]  # (query tokens, sequences, mean context) -> s


@dataclass
class _Request:
    prompt_tokens: int
    max_tokens: int
    out: queue.Queue[str | None] = field(default_factory=queue.Queue)
    generated: int = 0


class StandInEngine:
    def __init__(
        self,
        step_time: StepTime,
        model: str = "stand-in-model",
        kv_capacity_tokens: float = 1e7,
        prefill_time: Callable[[int], float] = lambda tokens: 0.005,
        max_running: int = 1 << 30,  # vLLM's --max-num-seqs: the rest wait
        vocabulary: int | None = None,  # token ids at or above it are refused in the stream, as vLLM does
    ):
        self.step_time, self.model, self.kv_capacity = step_time, model, kv_capacity_tokens
        self.max_running = max_running
        self.vocabulary = vocabulary
        self.prefill_time = prefill_time
        self._waiting: queue.Queue[_Request] = queue.Queue()
        self._running: list[_Request] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.steps = 0
        # (when its tokens went out, batch, mean context, the step it meant to take) for every decode
        # step: what the engine really did, which a loaded machine can make differ from the formula.
        self.step_log: list[tuple[float, int, float, float]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [{"id": engine.model}]}).encode())
                elif self.path == "/metrics":
                    self._send(200, engine.metrics().encode(), "text/plain; version=0.0.4")
                elif self.path == "/stand-in/steps":  # the log so far, and a fresh one from here
                    with engine._lock:
                        log, engine.step_log = engine.step_log, []
                    self._send(200, json.dumps(log).encode())
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if self.path != "/v1/completions" or body.get("model") != engine.model:
                    self._send(404, b'{"error": "unknown model or path"}')
                    return
                prompt = body.get("prompt", "")
                n = len(prompt) if isinstance(prompt, list) else max(len(str(prompt).split()), 1)
                req = _Request(n, int(body.get("max_tokens", 16)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                ids = prompt if isinstance(prompt, list) else []
                if engine.vocabulary is not None and (bad := [t for t in ids if t >= engine.vocabulary]):
                    # HTTP 200, then the error in the stream (what vLLM 0.32 answers).
                    error = {"message": f"Token id {bad[0]} is out of vocabulary", "code": 400}
                    self._chunk(f"data: {json.dumps({'error': error})}\n\n")
                    self._chunk("data: [DONE]\n\n")
                    self._chunk("")
                    return
                engine._waiting.put(req)
                while (item := req.out.get()) is not None:
                    self._chunk(f"data: {item}\n\n")
                self._chunk("data: [DONE]\n\n")
                self._chunk("")

            def _chunk(self, text: str) -> None:
                data = text.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024  # uvicorn's backlog is 2048; the default 5 resets a burst

            def handle_error(self, request: object, client_address: object) -> None:
                pass  # a client that goes away mid-stream (a profile stopped at its budget)

        self._server = Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self._loop = threading.Thread(target=self._run, daemon=True)
        self._loop.start()

    def metrics(self) -> str:
        with self._lock:
            running = len(self._running)
            kv = sum(r.prompt_tokens + r.generated for r in self._running) / self.kv_capacity
        labels = f'{{model_name="{self.model}",engine="0"}}'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{labels} {running}\n"
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{labels} {kv}\n"
        )

    def _emit(self, req: _Request, finished: bool) -> None:
        choice = {"index": 0, "text": " tok", "finish_reason": "length" if finished else None}
        req.out.put(json.dumps({"object": "text_completion", "model": self.model, "choices": [choice]}))
        if finished:
            req.out.put(None)

    def _run(self) -> None:
        deadline = time.perf_counter()
        while not self._stop.is_set():
            new: list[_Request] = []
            with self._lock:
                running = list(self._running)
            while len(running) + len(new) < self.max_running:
                try:
                    new.append(self._waiting.get_nowait())
                except queue.Empty:
                    break
            if not new and not running:
                time.sleep(0.0005)
                deadline = time.perf_counter()
                continue
            if new:  # one prefill step of the new prompts; each request's first token comes out of it
                step = self.prefill_time(sum(r.prompt_tokens for r in new))
            else:
                ctx = sum(r.prompt_tokens + r.generated for r in running) / len(running)
                step = self.step_time(len(running), len(running), ctx)
            # Absolute deadlines: handing tokens out takes time, and must not add to the step.
            deadline = max(deadline, time.perf_counter() - 0.05) + step
            while (left := deadline - time.perf_counter()) > 0:
                time.sleep(min(left, 0.01))
            self.steps += 1
            if not new:
                with self._lock:
                    self.step_log.append((time.perf_counter(), len(running), ctx, step))
            for r in new if new else running:
                r.generated += 1
                done = r.generated >= r.max_tokens
                self._emit(r, done)
            with self._lock:
                if new:
                    self._running += [r for r in new if r.generated < r.max_tokens]
                else:
                    self._running = [r for r in self._running if r.generated < r.max_tokens]

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()


class StandInProcess:
    """A StandInEngine in a forked process of its own, as a real engine is: its threads then do not
    share the interpreter lock with the client's, and a busy client does not slow its steps."""

    def __init__(self, step_time: StepTime, **kwargs: object):
        import multiprocessing

        ctx = multiprocessing.get_context("fork")  # the step-time closure is inherited, not pickled
        parent, child = ctx.Pipe()
        self._process = ctx.Process(target=self._serve, args=(child, step_time, kwargs), daemon=True)
        self._process.start()
        if not parent.poll(30):
            self._process.kill()
            raise RuntimeError("the stand-in engine did not start within 30 s")
        self.port: int = parent.recv()
        self.url = f"http://127.0.0.1:{self.port}"
        self._pipe = parent

    @staticmethod
    def _serve(pipe: object, step_time: StepTime, kwargs: dict[str, object]) -> None:
        engine = StandInEngine(step_time, **kwargs)  # type: ignore[arg-type]
        pipe.send(engine.port)  # type: ignore[attr-defined]
        with contextlib.suppress(EOFError):  # anything, or EOF when the parent goes
            pipe.recv()  # type: ignore[attr-defined]
        engine.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._pipe.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()
