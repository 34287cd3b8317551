"""bench-verify: the verify-pass cost table (timings are not asserted, only what they must satisfy)."""

import json

import pytest

from blockdraft.cli import main
from blockdraft.config import ConfigError
from blockdraft.eval.verify_cost import verify_cost_table
from chat_fixtures import save_tiny_chat_model


def test_table_rows_and_ratios(tmp_path):
    model = save_tiny_chat_model(tmp_path / "t", hidden_size=32, num_layers=2)
    rows = verify_cost_table(str(model), dtypes=("bf16", "fp32"), tokens=(1, 4), repeats=1, context=8)
    assert [(r["dtype"], r["tokens"]) for r in rows] == [("bf16", 1), ("bf16", 4), ("fp32", 1), ("fp32", 4)]
    assert all(r["seconds"] > 0 for r in rows)
    assert [r["x_own_step"] for r in rows if r["tokens"] == 1] == [1.0, 1.0]
    assert min(r["x_fastest_step"] for r in rows if r["tokens"] == 1) == 1.0
    for r in rows:
        own_step = next(o["seconds"] for o in rows if o["dtype"] == r["dtype"] and o["tokens"] == 1)
        assert r["x_own_step"] == pytest.approx(r["seconds"] / own_step)
    with pytest.raises(ConfigError, match="tokens >= 1"):
        verify_cost_table(str(model), tokens=(0, 2))


def test_cli_prints_json(tmp_path, capsys):
    model = save_tiny_chat_model(tmp_path / "t", hidden_size=32, num_layers=2)
    assert main(["bench-verify", "--target", str(model), "--dtype", "fp32", "--tokens", "1", "2",
                 "--repeats", "1", "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["native_bf16"] in (True, False) and [r["tokens"] for r in out["rows"]] == [1, 2]
