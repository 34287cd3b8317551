"""One `llama-server` process: started on a free port, health-checked, asked for greedy completions of
token ids, stopped on exit and on Ctrl-C; on Linux it is also sent SIGTERM when the process that started
it dies any other way (SIGTERM, SIGKILL, a crash: `PR_SET_PDEATHSIG`), so no server outlives its bench.

Decode speed and draft acceptance come from the server's own per-request `timings`:
`predicted_n` tokens generated, `predicted_ms` from the first generated token to the last (the first
token comes from the prompt's pass, so llama.cpp's `predicted_per_second` is (predicted_n - 1) /
predicted_ms, prefill excluded, as ours), and with a draft `draft_n` tokens proposed, `draft_n_accepted`
accepted. A verify round commits its accepted drafts plus one target token, and a step without a draft
commits one token, so the target's decode passes are (predicted_n - 1) - draft_n_accepted (exact
unless the budget cut the last round short).
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..files import open_own, why_not_a_file
from .llamacpp import EngineError

STARTUP_TIMEOUT_S = 300.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h
REQUEST_TIMEOUT_S = 1800.0

_live: set["LlamaServer"] = set()


def _stop_all() -> None:
    for server in list(_live):
        server.stop()


atexit.register(_stop_all)


def _die_with_parent() -> None:
    """Run in the child between fork and exec: Linux sends it SIGTERM when the thread that started it
    exits, whatever ends that thread (a kill -9 of the bench included). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Timings:
    """One request's numbers, as the server reported them."""

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0
    draft_n_accepted: int = 0

    @property
    def decode_tokens(self) -> int:
        return max(0, self.predicted_n - 1)

    @property
    def decode_s(self) -> float:
        return self.predicted_ms / 1000.0

    @property
    def verify_rounds(self) -> int:
        """Target decode passes after the prompt's: each commits its accepted drafts plus one token."""
        return max(0, self.decode_tokens - self.draft_n_accepted)

    @property
    def tau(self) -> float | None:
        """Tokens committed per target decode pass (our tau); None when nothing was decoded."""
        return self.decode_tokens / self.verify_rounds if self.verify_rounds else None


def parse_timings(payload: dict[str, Any]) -> Timings:
    """`timings` of a `/completion` response -> Timings; a named error when it is missing or malformed."""
    timings = payload.get("timings")
    if not isinstance(timings, dict):
        raise EngineError(f"llama-server's response has no timings (keys: {sorted(payload)[:12]}); this blockdraft "
                          "reads llama.cpp 11434's /completion response")
    try:
        return Timings(prompt_n=int(timings["prompt_n"]), prompt_ms=float(timings["prompt_ms"]),
                       predicted_n=int(timings["predicted_n"]), predicted_ms=float(timings["predicted_ms"]),
                       draft_n=int(timings.get("draft_n") or 0),  # ik_llama.cpp's server reports no draft counts
                       draft_n_accepted=int(timings.get("draft_n_accepted") or 0))
    except (KeyError, TypeError, ValueError) as err:
        raise EngineError(f"llama-server's timings are malformed ({type(err).__name__}: {err}): {timings}") from None


def logprob_ids(answer: dict[str, Any]) -> list[int]:
    """The generated token ids of a `/v1/completions` answer asked with `logprobs` (each entry's `id`)."""
    try:
        return [int(entry["id"]) for entry in answer["choices"][0]["logprobs"]["content"]]
    except (KeyError, IndexError, TypeError, ValueError) as err:
        raise EngineError(f"llama-server's /v1/completions answer carries no token ids in its logprobs "
                          f"({type(err).__name__}: {err})") from None


class LlamaServer:
    """`with LlamaServer(binary, model, ...) as server: server.complete(ids, 128)`."""

    def __init__(self, binary: str | Path, model: str | Path, *, draft: str | Path | None = None,
                 extra_args: Sequence[str] = (), threads: int | None = None, ctx_size: int = 4096,
                 log_path: str | Path | None = None, host: str = "127.0.0.1", port: int | None = None,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S, ids_from: str = "tokens", webui_flag: bool = True):
        """`ids_from`: where a completion's token ids come from: "tokens" (llama.cpp's `/completion` with
        `return_tokens`) or "logprobs" (`/v1/completions` with `logprobs: 1`, each entry's `id`: ik_llama.cpp's
        server, whose `/completion` returns text only). `webui_flag`: pass `--no-webui` (llama.cpp's flag;
        ik_llama.cpp's server does not know it)."""
        if ids_from not in ("tokens", "logprobs"):
            raise ValueError(f"ids_from is tokens or logprobs, got {ids_from!r}")
        self.binary, self.model, self.draft = Path(binary), Path(model), None if draft is None else Path(draft)
        self.extra_args, self.threads, self.ctx_size = list(extra_args), threads, ctx_size
        self.log_path = None if log_path is None else Path(log_path)
        self.host, self.port, self.startup_timeout_s = host, port, startup_timeout_s
        self.ids_from, self.webui_flag = ids_from, webui_flag
        self.process: subprocess.Popen | None = None
        self._log = None

    def command(self) -> list[str]:
        command = [str(self.binary), "-m", str(self.model), "--host", self.host, "--port", str(self.port),
                   "-c", str(self.ctx_size), "-np", "1"] + (["--no-webui"] if self.webui_flag else [])
        if self.threads:
            command += ["-t", str(self.threads), "-tb", str(self.threads)]
        if self.draft is not None:
            command += ["-md", str(self.draft)]
            if self.threads:
                command += ["-td", str(self.threads), "-tbd", str(self.threads)]
        return command + self.extra_args

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_tail(self, lines: int = 25) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def start(self) -> "LlamaServer":
        for path, what in ((self.binary, "llama-server"), (self.model, "model"), (self.draft, "draft model")):
            if path is not None and not path.is_file():
                raise EngineError(f"{what} {path} {why_not_a_file(path)}"
                                  + ("; run `blockdraft engines build llama.cpp`" if what == "llama-server" else ""))
        if self.port is None:
            self.port = free_port(self.host)
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open_own(self.log_path, "ab", what="the server's log")
            self._log.write(("$ " + " ".join(self.command()) + "\n").encode())
            self._log.flush()
        # its own process group, so stop() ends it with its children and a Ctrl-C in our terminal reaches us
        # first; and it dies with us when we die without running stop()
        self.process = subprocess.Popen(self.command(), stdout=self._log or subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        _live.add(self)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise EngineError(f"llama-server exited with code {self.process.returncode} before it was ready "
                                  f"(port {self.port} taken, a model it cannot load, or a crash); its log "
                                  f"{self.log_path}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        raise EngineError(f"llama-server did not become healthy within {self.startup_timeout_s:.0f} s on port "
                          f"{self.port}; its log {self.log_path}:\n{self.log_tail()}")

    def request(self, route: str, payload: dict[str, Any]) -> dict[str, Any]:
        if self.process is None or self.process.poll() is not None:
            raise EngineError(f"llama-server is not running (exit {None if self.process is None else self.process.returncode}); "
                              f"its log {self.log_path}:\n{self.log_tail()}")
        request = urllib.request.Request(self.url + route, data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")[:500]
            raise EngineError(f"llama-server answered {route} with HTTP {err.code}: {body}") from None
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as err:
            raise EngineError(f"llama-server failed on {route} ({type(err).__name__}: {err}); its log "
                              f"{self.log_path}:\n{self.log_tail()}") from None

    def tokenize(self, text: str) -> list[int]:
        return [int(t) for t in self.request("/tokenize", {"content": text, "add_special": False,
                                                           "parse_special": True})["tokens"]]

    def complete(self, prompt_ids: Sequence[int], max_new_tokens: int, *, seed: int = 0,
                 ignore_eos: bool = False) -> tuple[list[int], Timings]:
        """Greedy completion of the token ids; returns (generated ids, the server's timings)."""
        payload = {"prompt": [int(t) for t in prompt_ids], "temperature": 0.0, "top_k": 1, "seed": int(seed),
                   "cache_prompt": False, "stream": False, "repeat_penalty": 1.0, "ignore_eos": bool(ignore_eos)}
        if self.ids_from == "logprobs":
            answer = self.request("/v1/completions", {**payload, "max_tokens": int(max_new_tokens), "logprobs": 1})
            tokens, timings = logprob_ids(answer), parse_timings(answer)
            if len(tokens) != timings.predicted_n:
                raise EngineError(f"llama-server's /v1/completions gave {len(tokens)} token ids for the "
                                  f"{timings.predicted_n} tokens it generated: its output cannot be checked")
            return tokens, timings
        answer = self.request("/completion", {**payload, "n_predict": int(max_new_tokens), "return_tokens": True})
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            raise EngineError("llama-server's /completion response has no `tokens`; it must honour return_tokens")
        return [int(t) for t in tokens], parse_timings(answer)

    def stop(self) -> None:
        process, self.process = self.process, None
        _live.discard(self)
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> "LlamaServer":
        return self.start() if self.process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()
