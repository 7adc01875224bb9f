"""Bad input at every entry point: one stderr line with its fix, a non-zero exit (78 for a config
error), no traceback, nothing created, changed or deleted, no model loaded, no server asked.

First the failures a user found (each fails without its fix), then property-based tests that
generate malformed values from each input's schema (RunConfig's field metadata for dflash-train).

Hypothesis's profiles ("ci", the default, and "nightly") are tests/conftest.py's.
"""

import http.server
import json
import math
import os
import threading
from pathlib import Path

import pytest
from flashfleet.contract import messages
from flashfleet.contract.messages import EX_CONFIG
from hypothesis import HealthCheck, settings

from tests.conftest import examples
from tests.unit.test_bad_input import _both_refuse, _tree, no_target_load, out_dir, trained  # noqa: F401 (fixtures)


def gen_settings(n: int = 1):
    return settings(max_examples=examples(n), deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def one_line(err: str) -> str:
    """The contract's stderr: exactly one line, a config error with its fix, no traceback."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    assert messages.CONFIG_ERROR_RE.fullmatch(lines[0]) and "(fix: " in lines[0], lines
    return lines[0]


# ---- a server stub that counts what it is asked ---------------------------------------------------

class Stub:
    """A loopback HTTP server answering every request with `reply(path, body)` -> (status, bytes)."""

    def __init__(self, reply):
        self.requests = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                stub.requests.append((self.path, body))
                status, data = reply(self.path, body)
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *_):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


HTML = b"<!doctype html>\n<html><body>\n<h1>Welcome to nginx!</h1>\n</body></html>\n"


@pytest.fixture
def html_server():
    s = Stub(lambda path, body: (200, HTML))
    yield s
    s.close()


@pytest.fixture
def counting_server():
    """Answers nothing useful: any request at all is the failure its tests look for."""
    s = Stub(lambda path, body: (500, b"{}"))
    yield s
    s.close()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    from tests.chat_tokenizer import make_tokenizer

    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def convs(tmp_path) -> Path:
    from tests.chat_tokenizer import write_jsonl

    return write_jsonl(tmp_path / "convs.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                                {"role": "assistant", "content": "hello"}]}])


# ---- 1. an export never writes into, or deletes, the run it reads from -----------------------------

@pytest.fixture
def run_dir(trained, tmp_path):  # noqa: F811 (the fixture imported above)
    import shutil

    return Path(shutil.copytree(trained, tmp_path / "run"))


@pytest.mark.parametrize("where", ["same", "checkpoints", "run-file", "checkpoint-source", "above", "symlink"])
def test_export_into_the_run_it_reads_is_refused(run_dir, tmp_path, capsys, where):
    """Inside the run only a new path or a previous export may be written (collect.yml exports to
    <run>/drafter); the run itself, what holds it, and what it holds are refused."""
    from flashfleet_trainer.export import main

    source, out = run_dir, {"same": run_dir, "checkpoints": run_dir / "checkpoints", "above": tmp_path,
                            "run-file": run_dir / "status.json", "symlink": tmp_path / "link"}.get(where)
    if where == "checkpoint-source":  # a checkpoint's run is protected too
        source, out = run_dir / "checkpoints" / "step-00000002", run_dir
    if where == "symlink":
        out.symlink_to(run_dir)
    before = _tree(tmp_path)
    assert main([str(source), str(out), "--force"]) == EX_CONFIG  # was: the run deleted, exit 0
    line = one_line(capsys.readouterr().err)
    assert "which the export reads from" in line and "outside the run directory" in line
    assert _tree(tmp_path) == before
    if where == "same":  # beside the checkpoints, a new path: collect.yml's export is written
        assert main([str(run_dir), str(run_dir / "drafter")]) == 0


def test_export_out_dir_that_is_a_file_names_it(run_dir, tmp_path, capsys):
    from flashfleet_trainer.export import main

    f = tmp_path / "file"
    f.write_text("x")
    for force in ([], ["--force"]):
        assert main([str(run_dir), str(f), *force]) == EX_CONFIG
        assert "is a file, not a directory" in one_line(capsys.readouterr().err)
    assert f.read_text() == "x"


# ---- 2. zero supervised rows after --max-seq-len ---------------------------------------------------

def test_max_seq_len_shorter_than_every_prompt_is_refused(trainer_argv, trainer_tiny, tmp_path, capsys,
                                                          no_target_load):  # noqa: F811
    """The tiny data's prompts are 8 tokens, unsupervised: --max-seq-len 6 leaves zero rows (was:
    --check ok, then every step's loss nan on zero rows, and "completed")."""
    out = tmp_path / "run"
    out.mkdir()
    line = _both_refuse(trainer_argv("--max-seq-len", "6", out=out), capsys, [trainer_tiny / "data", out],
                        "--max-seq-len 6: no supervised token pair is left in the data after truncation")
    assert "raise --max-seq-len to at least" in line


def test_the_run_refuses_zero_supervised_rows_where_it_loads_the_data(trainer_tiny):
    """The run-time guard: what preflight's bounded scan did not read is checked as the run loads it."""
    from flashfleet_trainer.data import load_data
    from flashfleet_trainer.errors import ConfigError

    with pytest.raises(ConfigError, match="--max-seq-len 6: no supervised token pair"):
        load_data(trainer_tiny / "data", 6)
    assert len(load_data(trainer_tiny / "data", 16)) == 48


# ---- 3. regenerate into a built --out asks nobody ---------------------------------------------------

def test_regenerate_into_a_built_out_asks_no_prompt(chat_model, counting_server, tmp_path, capsys):
    from flashfleet_trainer.data_cli import main

    out = tmp_path / "data"
    out.mkdir()
    (out / "part-00000.parquet").write_bytes(b"a build")
    before = _tree(out)
    rc = main(["regenerate", "--model", str(chat_model), "--input", str(convs(tmp_path)), "--out", str(out),
               "--server", counting_server.url])
    assert rc == EX_CONFIG
    assert "already holds 1 Parquet file(s)" in one_line(capsys.readouterr().err)
    assert counting_server.requests == [] and _tree(out) == before


# ---- 4. tracebacks that were the only message ------------------------------------------------------

def test_data_out_that_is_a_file(chat_model, tmp_path, capsys):
    from flashfleet_trainer.data_cli import main

    f = tmp_path / "file"
    f.write_text("x")
    for out in (f, f / "below"):
        assert main(["build", "--model", str(chat_model), "--input", str(convs(tmp_path)), "--out", str(out)]) == 78
        assert "is a file, not a directory" in one_line(capsys.readouterr().err)
    assert f.read_text() == "x"


def test_train_output_dir_that_is_a_file(trainer_argv, trainer_tiny, tmp_path, capsys, no_target_load):  # noqa: F811
    f = tmp_path / "file"
    f.write_text("x")
    _both_refuse(trainer_argv(out=f), capsys, [tmp_path], f"--output-dir {f}: {f} is a file, not a directory")


def test_seed_beyond_what_the_libraries_take_is_refused_at_check(trainer_argv, tmp_path, capsys,
                                                                 no_target_load):  # noqa: F811
    line = _both_refuse(trainer_argv("--seed", str(2**64), out=tmp_path / "run"), capsys, [tmp_path], "--seed ")
    assert f"--seed {2**64}: must be >= 0 and at most {2**32 - 1}" in line


def test_regenerate_from_an_html_server(chat_model, html_server, tmp_path, capsys):
    from flashfleet_trainer.data_cli import main

    out = tmp_path / "data"
    rc = main(["regenerate", "--model", str(chat_model), "--input", str(convs(tmp_path)), "--out", str(out),
               "--server", html_server.url])
    assert rc == EX_CONFIG
    assert "answered something not a JSON object" in one_line(capsys.readouterr().err)
    assert not out.exists()


def test_vllm_probe_and_train_check_of_an_html_server(html_server, trainer_argv, tmp_path, capsys,
                                                      no_target_load):  # noqa: F811
    from flashfleet_trainer.cli import main as train
    from flashfleet_trainer.vllm_target import main as probe

    assert probe([html_server.url, "--layers", "3,4", "--timeout", "0"]) == EX_CONFIG
    assert "that is no vLLM server" in one_line(capsys.readouterr().err)
    out = tmp_path / "run"
    assert train(trainer_argv("--target-servers", html_server.url, "--check", out=out)) == EX_CONFIG
    assert "that is no vLLM server" in one_line(capsys.readouterr().err)
    assert not out.exists()


def test_an_html_error_page_is_one_line_too(tmp_path, capsys):
    from flashfleet_trainer.vllm_target import main as probe

    s = Stub(lambda path, body: (502, HTML))
    try:
        assert probe([s.url, "--layers", "3", "--timeout", "0"]) == 1  # a proxy before a restarting server: retry
    finally:
        s.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "answered HTTP 502" in err[0], err


@pytest.mark.parametrize("models", [{"data": [{}]}, {"data": [1]}, {"data": "x"}])
def test_a_server_whose_model_list_is_malformed(models, chat_model, tmp_path, capsys):
    from flashfleet_trainer.data_cli import main as data
    from flashfleet_trainer.vllm_target import main as probe

    s = Stub(lambda path, body: (200, json.dumps({"version": "0.32.0"} if path == "/version" else models).encode()))
    try:
        assert probe([s.url, "--layers", "3", "--timeout", "0"]) in (1, EX_CONFIG)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in err[0], err
        out = tmp_path / "data"
        assert data(["regenerate", "--model", str(chat_model), "--input", str(convs(tmp_path)), "--out", str(out),
                     "--server", s.url]) == EX_CONFIG
        assert "lists no models" in one_line(capsys.readouterr().err) and not out.exists()
    finally:
        s.close()


# ---- 5. a server of another model: exit 78, no restart loop -----------------------------------------

def fake_vllm(hidden: int, layers: list[int]):
    """A stub vLLM extraction server whose states are `hidden` wide (another model's, when that is
    not the target's width), written where vllm_target reads them, as vLLM's connector does."""
    import tempfile

    import torch
    from flashfleet_trainer.vllm_format import HIDDEN_KEY, LAYER_IDS_KEY, TOKENS_KEY
    from safetensors.torch import save_file

    def reply(path, body):
        if path == "/version":
            return 200, json.dumps({"version": "0.32.0"}).encode()
        if path == "/v1/models":
            return 200, json.dumps({"data": [{"id": "other", "max_model_len": 4096}]}).encode()
        ids = body["prompt"]
        fd, f = tempfile.mkstemp(suffix=".safetensors")
        os.close(fd)
        save_file({HIDDEN_KEY: torch.randn(len(ids), len(layers), hidden), TOKENS_KEY: torch.tensor(ids),
                   LAYER_IDS_KEY: torch.tensor(layers)}, f)
        Path(f + ".lock").write_text("")
        return 200, json.dumps({"kv_transfer_params": {"hidden_states_path": f}}).encode()

    return Stub(reply)


def test_a_server_of_another_model_is_a_config_error(trainer_argv, tmp_path, capsys, no_target_load):  # noqa: F811
    """The tiny target is 64 wide with 4 layers (features of layer 1 by default for one draft
    layer, vLLM ids [2, 4]); the server's states are 48 wide. Was: exit 1, restarted forever."""
    from flashfleet_trainer.cli import main

    s = fake_vllm(48, [2, 4])
    try:
        out = tmp_path / "run"
        rc = main(trainer_argv("--target-servers", s.url, "--target-layers", "1", "--check", out=out))
        line = one_line(capsys.readouterr().err)
    finally:
        s.close()
    assert rc == EX_CONFIG == 78, line
    assert "it serves another model than --target-model" in line and "start the server with" in line
    assert not out.exists()


# ---- generated: malformed values from each input's schema -------------------------------------------
# Every property runs its command on one malformed input and asserts the whole contract (refused()).

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

ROOT = os.geteuid() == 0  # root writes anywhere: an unwritable path cannot be made


def refused(call, roots, capsys, server=None, code=EX_CONFIG) -> str:
    """Run call() -> rc; assert the contract: the exit code, one line with its fix, no traceback,
    nothing under `roots` changed, no request to `server` (no_target_load guards the model)."""
    before = {str(r): _tree(r) for r in roots}
    asked = len(server.requests) if server else 0
    rc = call()
    cap = capsys.readouterr()
    assert rc == code, (rc, cap.out[-500:], cap.err)
    line = one_line(cap.err)
    assert "check: ok" not in cap.out
    assert {str(r): _tree(r) for r in roots} == before
    assert not server or len(server.requests) == asked, server.requests
    return line


def nums(lo=None, hi=None, *, integer: bool, open_lo=False, open_hi=False):
    """Values outside [lo, hi] (open ends excluded too), and nan/inf for floats, as flag strings."""
    out = []
    if lo is not None:
        edge = lo if open_lo else (lo - 1 if integer else math.nextafter(lo, -math.inf))
        out += [st.just(edge), st.integers(-10**30, math.floor(edge)) if integer else
                st.floats(max_value=edge, allow_nan=False, allow_infinity=False)]
    if hi is not None:
        edge = hi if open_hi else (hi + 1 if integer else math.nextafter(hi, math.inf))
        out += [st.just(edge), st.integers(math.ceil(edge), 10**30) if integer else
                st.floats(min_value=edge, allow_nan=False, allow_infinity=False)]
    if not integer:
        out += [st.sampled_from([math.nan, math.inf, -math.inf])]
    return st.one_of(out).map(str) if out else st.nothing()


# Not numbers at all, whatever the flag's type (argparse's conversion, or ours).
NOT_NUMBERS = st.sampled_from(["", "abc", "1,5", "0x", "--", "1e", "[1]", "None", "true"])


def _bounds(f):
    """(lo, hi, open_lo, open_hi) of a RunConfig field, from its metadata (`most`: the implementation's cap)."""
    m = f.metadata
    lo, open_lo = (m["ge"], False) if m["ge"] is not None else (m["gt"], m["gt"] is not None)
    his = [(m["le"], False), (m["lt"], True), (m["most"], False)]
    hi, open_hi = min(((v, o) for v, o in his if v is not None), default=(None, False))
    return lo, hi, open_lo, open_hi


def _numeric_fields():
    from flashfleet_trainer.config import FIELDS, base_type

    return {f.name: f for f in FIELDS.values() if base_type(f) in (int, float)}


NUMERIC = _numeric_fields()


@st.composite
def bad_train_number(draw):
    """(flag, value) of dflash-train: a numeric field of RunConfig and a value its bounds refuse."""
    from flashfleet_trainer.config import base_type, flag

    f = NUMERIC[draw(st.sampled_from(sorted(NUMERIC)))]
    integer = base_type(f) is int
    lo, hi, open_lo, open_hi = _bounds(f)
    wrong = [nums(lo, hi, integer=integer, open_lo=open_lo, open_hi=open_hi), NOT_NUMBERS]
    if integer:
        wrong.append(st.sampled_from(["1.5", "nan", "inf", "1e3"]))  # no int, or no finite int
    return flag(f.name), draw(st.one_of([s for s in wrong if not s.is_empty]))


@gen_settings(6)
@given(bad=bad_train_number())
def test_train_numeric_flag(bad, trainer_argv, out_dir, capsys, no_target_load):  # noqa: F811
    from flashfleet_trainer.cli import main

    flag, value = bad
    refused(lambda: main([*trainer_argv(out=out_dir), f"{flag}={value}", "--check"]), [out_dir], capsys)


def _path_cases(tmp: Path):
    """Paths that cannot be what a flag needs: missing, a file, a directory under a file, empty."""
    f = tmp / "a-file"
    f.write_text("x")
    d = tmp / "empty-dir"
    d.mkdir(exist_ok=True)
    locked = tmp / "read-only"
    locked.mkdir(mode=0o555, exist_ok=True)
    return {"missing": tmp / "missing" / "x", "file": f, "under-file": f / "x", "empty-dir": d, "empty": "",
            # root writes anywhere: there a read-only directory's child is just another missing path
            "unwritable": locked / "x"}


UNWRITABLE = [] if ROOT else ["unwritable"]


TRAIN_PATHS = {"--target-model": ["missing", "file", "under-file", "empty-dir", "empty"],
               "--data-dir": ["missing", "file", "under-file", "empty-dir", "empty"],
               "--output-dir": ["file", "under-file", "empty", *UNWRITABLE],
               "--eval-prompts": ["missing", "under-file", "empty-dir"],
               "--init-from": ["missing", "file", "under-file"],
               "--resume": ["missing", "file", "empty-dir"],
               "--config": ["missing", "under-file", "empty-dir", "file"]}


@gen_settings(2)
@given(case=st.sampled_from([(k, v) for k, vs in TRAIN_PATHS.items() for v in vs]))
def test_train_path_flag(case, trainer_argv, out_dir, tmp_path, capsys, no_target_load):  # noqa: F811
    from flashfleet_trainer.cli import main

    flag, kind = case
    path = str(_path_cases(tmp_path)[kind])
    argv = trainer_argv(out=out_dir)
    if flag in argv:
        argv[argv.index(flag) + 1] = path
    else:
        argv += [flag, path]
    refused(lambda: main([*argv, "--check"]), [out_dir, tmp_path / "empty-dir"], capsys)


# JSON values of a type no field of that type takes (a string field converts numbers: not generated).
JSON_SCALARS = st.one_of(st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=False),
                         st.text(max_size=8), st.none())
JSON_VALUES = st.one_of(JSON_SCALARS, st.lists(JSON_SCALARS, max_size=2),
                        st.dictionaries(st.text(max_size=4), JSON_SCALARS, max_size=2))


def _wrong_json_type(f):
    from flashfleet_trainer.config import base_type

    t = base_type(f)
    if t is bool:
        return JSON_VALUES.filter(lambda v: not isinstance(v, bool))
    if t in (int, float):
        ok = (lambda v: isinstance(v, int | float) and not isinstance(v, bool)) if t is float else \
            (lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer())
        # a string is converted as a flag's value is: only the non-numbers among them are wrong
        return JSON_VALUES.filter(lambda v: not ok(v) and not (isinstance(v, str) and _numeric(v))
                                  and not (v is None and f.default is None))
    if f.metadata["choices"]:
        return JSON_VALUES.filter(lambda v: v not in f.metadata["choices"] and not (v is None and f.default is None))
    return st.one_of(st.booleans(), st.lists(JSON_SCALARS, min_size=1, max_size=2))  # a str field


def _numeric(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def base_config(tiny, out) -> dict:
    """A good --config (the tiny assets, one CPU process): one key of it is spoilt per example."""
    return {"target_model": str(tiny / "model"), "data_dir": str(tiny / "data"), "output_dir": str(out),
            "target_gpus": "cpu", "drafter_gpus": "cpu", "block_size": 4, "num_draft_layers": 1,
            "token_budget": 256, "max_seq_len": 32, "max_batch_size": 8, "max_anchors": 16, "eval_num_prompts": 0}


@st.composite
def bad_config(draw):
    from flashfleet_trainer.config import FIELDS

    kind = draw(st.sampled_from(["type", "range", "unknown", "top", "text"]))
    if kind == "text":  # not JSON at all (bytes: a binary file, a cut one, another encoding)
        return draw(st.sampled_from([b"", b"{", b"\xff\xfe{}", b"{'lr': 1}", b"[1,", b"{\"lr\": NaN}"])), None
    if kind == "top":  # not an object at all
        return draw(st.one_of(JSON_SCALARS, st.lists(JSON_SCALARS, max_size=3))), None
    if kind == "unknown":
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in FIELDS or k == "config"))
        return {key: draw(JSON_SCALARS)}, key
    if kind == "range":
        key = draw(st.sampled_from(sorted(NUMERIC)))
        f = NUMERIC[key]
        lo, hi, open_lo, open_hi = _bounds(f)
        from flashfleet_trainer.config import base_type

        return {key: json.loads(draw(nums(lo, hi, integer=base_type(f) is int, open_lo=open_lo,
                                          open_hi=open_hi).filter(lambda s: s not in ("nan", "inf", "-inf"))))}, key
    key = draw(st.sampled_from(sorted(k for k in FIELDS if k != "config")))
    return {key: draw(_wrong_json_type(FIELDS[key]))}, key


@gen_settings(6)
@given(bad=bad_config())
def test_train_config_json(bad, trainer_tiny, out_dir, tmp_path, capsys, no_target_load):  # noqa: F811
    from flashfleet_trainer.cli import main

    spoilt, key = bad
    cfg = {**base_config(trainer_tiny, out_dir), **spoilt} if isinstance(spoilt, dict) else spoilt
    path = tmp_path / "run.json"
    path.write_bytes(cfg if isinstance(cfg, bytes) else json.dumps(cfg).encode())
    line = refused(lambda: main(["--config", str(path), "--check"]), [out_dir], capsys)
    assert key is None or key.replace("_", "-") in line or repr(key) in line or key in line, line


def test_the_good_config_is_good(trainer_tiny, out_dir, tmp_path, capsys):  # noqa: F811
    """The properties above spoil one key of this: it must pass on its own."""
    from flashfleet_trainer.cli import main

    path = tmp_path / "run.json"
    path.write_text(json.dumps(base_config(trainer_tiny, out_dir)))
    assert main(["--config", str(path), "--check"]) == 0, capsys.readouterr().err


# ---- dflash-eval ------------------------------------------------------------------------------------

EVAL_NUMBERS = {"--num-prompts": (1, None, True), "--max-new-tokens": (1, None, True),
                "--temperature": (0, None, False), "--seed": (0, 2**32 - 1, True), "--block-size": (2, None, True),
                "--num-draft-layers": (1, None, True), "--top-k": (0, None, True)}


@st.composite
def bad_eval(draw, tmp: Path):
    paths = _path_cases(tmp)
    kind = draw(st.sampled_from(["number", "top-p", "path", "device", "run-config"]))
    if kind == "number":
        flag = draw(st.sampled_from(sorted(EVAL_NUMBERS)))
        lo, hi, integer = EVAL_NUMBERS[flag]
        return [f"{flag}={draw(st.one_of(nums(lo, hi, integer=integer), NOT_NUMBERS))}"]
    if kind == "top-p":
        return [f"--top-p={draw(st.one_of(nums(0, 1, integer=False, open_lo=True), NOT_NUMBERS))}"]
    if kind == "device":
        return ["--device", draw(st.sampled_from(["gpu", "cuda:x", "", "cpu:0:1", "tpu"]))]
    if kind == "run-config":
        (tmp / "rc.json").write_text(json.dumps(draw(st.one_of(JSON_SCALARS, st.lists(JSON_SCALARS, max_size=2)))))
        return ["--run-config", str(tmp / "rc.json")]
    flag = draw(st.sampled_from(["--prompts", "--prompts-out"]))
    return [flag, str(paths[draw(st.sampled_from(["missing", "under-file", "empty-dir"]))])]


@gen_settings(3)
@given(data=st.data())
def test_eval_bad_input(data, trainer_tiny, out_dir, tmp_path, capsys, no_target_load):  # noqa: F811
    from flashfleet_trainer.evaluate import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": [1, 2, 3]}) + "\n")
    extra = data.draw(bad_eval(tmp_path))
    argv = ["--target-model", str(trainer_tiny / "model"), "--output-dir", str(out_dir), "--random-drafter",
            "--prompts", str(prompts), *extra]
    refused(lambda: main(argv), [out_dir, trainer_tiny / "model"], capsys)


# ---- dflash-export -------------------------------------------------------------------------------

@gen_settings(2)
@given(case=st.tuples(st.sampled_from(["run", "missing", "file", "under-file", "empty-dir", "empty"]),
                      st.sampled_from(["run", "checkpoints", "run-file", "above", "file", "under-file", "fresh",
                                       *UNWRITABLE]),
                      st.booleans()))
def test_export_bad_input(case, run_dir, tmp_path, capsys, no_target_load):  # noqa: F811
    from flashfleet_trainer.export import main

    src_kind, out_kind, force = case
    paths = _path_cases(tmp_path)
    if src_kind == "run" and out_kind == "fresh":
        return  # a good export: not this property's
    source = run_dir if src_kind == "run" else paths[src_kind]
    out = {"run": run_dir, "checkpoints": run_dir / "checkpoints" / "x", "run-file": run_dir / "status.json",
           "above": tmp_path, "fresh": tmp_path / "fresh"}.get(
        out_kind) or paths[out_kind]
    refused(lambda: main([str(source), str(out), *(["--force"] if force else [])]), [tmp_path], capsys)


@gen_settings(1)
@given(argv=st.sampled_from([[], ["only-one"], ["a", "b", "c"], ["a", "b", "--no-such-flag"], ["--force"]]))
def test_export_malformed_command_line(argv, tmp_path, capsys):
    from flashfleet_trainer.export import main

    refused(lambda: main(argv), [tmp_path], capsys)


# ---- dflash-data build / regenerate ----------------------------------------------------------------

DATA_NUMBERS = {"--max-len": (1, None, True, False), "--shard-rows": (1, None, True, False),
                "--temperature": (0, None, False, False), "--top-p": (0, 1, False, True),
                "--top-k": (0, None, True, False), "--max-tokens": (1, None, True, False),
                "--seed": (0, 2**32 - 1, True, False), "--concurrency": (1, None, True, False),
                "--request-timeout": (0, None, False, True), "--progress-s": (0, None, False, True)}
BUILD_ONLY = ("--max-len", "--shard-rows")


@st.composite
def bad_data(draw, tmp: Path):
    """(subcommand, extra argv, what replaces --out or None)."""
    paths = _path_cases(tmp)
    command = draw(st.sampled_from(["build", "regenerate"]))
    kind = draw(st.sampled_from(["number", "input", "out", "server"] if command == "regenerate" else
                                ["number", "input", "out"]))
    if kind == "number":
        flag = draw(st.sampled_from(sorted(DATA_NUMBERS) if command == "regenerate" else BUILD_ONLY))
        lo, hi, integer, open_lo = DATA_NUMBERS[flag]
        return command, [f"{flag}={draw(st.one_of(nums(lo, hi, integer=integer, open_lo=open_lo), NOT_NUMBERS))}"], None
    if kind == "input":
        return command, ["--input", str(paths[draw(st.sampled_from(["missing", "under-file", "empty-dir"]))])], None
    if kind == "out":
        return command, [], paths[draw(st.sampled_from(["file", "under-file", *UNWRITABLE]))]
    return command, ["--server", draw(st.sampled_from(["", "localhost:8000", "ftp://h:1", "http://", "http://[x",
                                                       "http://h:port", "http://h:0"]))], None


@gen_settings(4)
@given(data=st.data())
def test_data_bad_input(data, chat_model, counting_server, tmp_path, capsys):
    from flashfleet_trainer.data_cli import main

    command, extra, out = data.draw(bad_data(tmp_path))
    out = out or tmp_path / "data"
    argv = [command, "--model", str(chat_model), "--input", str(convs(tmp_path)), "--out", str(out)]
    if command == "regenerate" and "--server" not in extra:
        argv += ["--server", counting_server.url]
    refused(lambda: main([*argv, *extra]), [tmp_path], capsys, server=counting_server)


# ---- dflash-vllm-probe ----------------------------------------------------------------------------

@gen_settings(3)
@given(data=st.data())
def test_vllm_probe_bad_input(data, counting_server, tmp_path, capsys):
    from flashfleet_trainer.vllm_target import main

    url = data.draw(st.one_of(st.just(counting_server.url), st.sampled_from(
        ["", "localhost:8000", "ftp://h:1", "http://h", "http://[x", "http://h:port", "http://h:1/v1",
         f"{counting_server.url},{counting_server.url}"])))
    layers = data.draw(st.one_of(st.just("3,4"), st.sampled_from(["", "a", "3,,4", "-1", "3.5", "1e3"])))
    timeout = data.draw(st.one_of(st.just("0"), nums(0, None, integer=False), NOT_NUMBERS))
    if (url, layers, timeout) == (counting_server.url, "3,4", "0"):
        return  # all good: this one asks the server (and it answers 500)
    refused(lambda: main([url, f"--layers={layers}", f"--timeout={timeout}"]), [tmp_path], capsys,
            server=counting_server)


def _string_cases():
    """(flag, malformed value[, extra flags]) for dflash-train's string settings: choices from their
    field, the rest from what each one's parser reads (devices, layer lists, URLs, JSON)."""
    from flashfleet_trainer.config import FIELDS, flag

    choice = [st.tuples(st.just(flag(f.name)), st.text(max_size=6).filter(lambda v, c=f.metadata["choices"]: v not in c))
              for f in FIELDS.values() if f.metadata["choices"]]
    devices = st.tuples(st.sampled_from(["--target-gpus", "--drafter-gpus"]),
                        st.sampled_from(["", "gpu", "0,0", "-1", "1.5", "cpu,0", "0;1", "99"]))
    return st.one_of(*choice, devices, st.tuples(st.just("--target-layers"),
                                                 st.sampled_from(["a,b", "-1", "99", "2,1", "1,1", ",", "1.5"])),
                     st.tuples(st.just("--target-servers"),
                               st.sampled_from(["h:1", "ftp://h:1", "http://h", "http://h:1/v1", "http://[x",
                                                "http://h:1,http://h:1", "http://h:port"])),
                     st.tuples(st.just("--wandb-settings"), st.sampled_from(["{", "[]", "1", "\"x\"", "{\"mode\": 1}"])),
                     st.tuples(st.just("--drafter-layer-types"), st.sampled_from(["", "full,bogus", "sliding", "x"])),
                     st.tuples(st.just("--rdzv-endpoint"), st.sampled_from(["host", "host:", ":1", "h:0", "h:99999"])))


@gen_settings(4)
@given(case=_string_cases())
def test_train_string_flag(case, trainer_argv, out_dir, capsys, no_target_load):  # noqa: F811
    from flashfleet_trainer.cli import main

    flag, value = case
    refused(lambda: main([*trainer_argv(out=out_dir), f"{flag}={value}", "--check"]), [out_dir], capsys)
