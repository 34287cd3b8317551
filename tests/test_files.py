"""`blockdraft/files.py`'s own rules: the JSONL reader (rows end at "\\n" only), the reader gate (FIFOs,
devices, oversized files, JSON nesting and numbers) and `read_text`'s named errors."""

import gzip
import json
import os

import pytest

from blockdraft.config import ConfigError
from blockdraft.files import (MAX_JSON_DEPTH, JsonLineError, check_input, json_lines, loads, parse_json, read_json,
                              read_json_lines, read_text)

# every character `str.splitlines` ends a line at besides "\n" and "\r"; the last three JSON keeps raw
# inside strings (they are not control characters), the others it refuses raw (they must be escaped)
RAW_IN_JSON_STRINGS = "\u2028\u2029\x85"
CONTROL_BREAKS = "\x0b\x0c\x1c\x1d\x1e"


def test_a_row_keeps_unicode_line_separators_inside_its_strings(tmp_path):
    text = "one\u2028two\u2029three\x85four"
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"text": text}, ensure_ascii=False) + "\n" + json.dumps({"text": "plain"}) + "\n",
                    encoding="utf-8")
    assert read_json_lines(path) == [{"text": text}, {"text": "plain"}]
    # negative control: splitting as str.splitlines does cuts the first row in four
    assert len([line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]) == 5


@pytest.mark.parametrize("separator", RAW_IN_JSON_STRINGS)
def test_line_numbers_count_newlines_only(separator):
    text = json.dumps({"a": f"x{separator}y"}, ensure_ascii=False) + "\n\n" + "{broken\n"
    with pytest.raises(JsonLineError, match="line 3 ") as caught:
        list(json_lines(text, what="rows.jsonl"))
    assert caught.value.number == 3 and not caught.value.cut
    assert isinstance(caught.value, ConfigError)  # commands print it as a named error


@pytest.mark.parametrize("separator", CONTROL_BREAKS)
def test_a_raw_control_break_is_refused_on_its_own_line(separator):
    """JSON forbids raw control characters in strings: the row is refused whole, at its own line number,
    not split at the character into two rows that fail one line further down."""
    text = '{"a": 1}\n' + '{"a": "x' + separator + 'y"}\n'
    with pytest.raises(JsonLineError) as caught:
        list(json_lines(text))
    assert caught.value.number == 2 and "control character" in caught.value.reason


def test_crlf_rows_blank_lines_and_a_cut_last_row():
    assert list(json_lines('{"a": 1}\r\n\r\n  \n[2]\r\n')) == [(1, {"a": 1}), (4, [2])]
    with pytest.raises(JsonLineError) as caught:
        list(json_lines('{"a": 1}\n{"a": '))
    assert caught.value.cut and caught.value.number == 2
    with pytest.raises(JsonLineError) as caught:  # the same row with its newline was written whole: not cut
        list(json_lines('{"a": 1}\n{"a": \n'))
    assert not caught.value.cut


def test_json_lines_bounds_nesting_and_numbers():
    deep = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    ok = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert list(json_lines(ok + "\n"))[0][0] == 1
    with pytest.raises(JsonLineError, match="nested deeper"):
        list(json_lines("{}\n" + deep + "\n"))
    with pytest.raises(JsonLineError, match="beyond 64 bits"):
        list(json_lines('{"seed": 18446744073709551616}\n'))
    assert loads(str(2 ** 63 - 1)) == 2 ** 63 - 1
    with pytest.raises(json.JSONDecodeError):
        loads("[" * 100_000)  # deeper than Python's recursion: still a JSON error, never a RecursionError


def test_read_json_lines_reads_gzip_and_names_the_file(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"a": "\xe2\x80\xa8"}\n'))
    assert read_json_lines(path) == [{"a": "\u2028"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\nnot json\n')
    with pytest.raises(JsonLineError, match=r"metrics .*bad\.jsonl line 2 is not valid JSON"):
        read_json_lines(bad, what="metrics")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_the_gate_refuses_a_fifo_without_opening_it(tmp_path):
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block forever: the gate must refuse it from its stat
    for read in (check_input, read_text, read_json_lines, read_json):
        with pytest.raises(ConfigError, match="not a regular file"):
            read(fifo)


def test_the_gate_refuses_folders_missing_files_and_devices(tmp_path):
    with pytest.raises(ConfigError, match="is a folder"):
        check_input(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        check_input(tmp_path / "nope.json")
    if os.path.exists("/dev/zero"):
        with pytest.raises(ConfigError, match="not a regular file"):
            read_text("/dev/zero")  # a device that never ends


def test_the_gate_refuses_an_oversized_file_by_its_size(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"pad": "x" * 2000}))
    assert read_json(path, max_bytes=4096) == {"pad": "x" * 2000}
    with pytest.raises(ConfigError, match="more than the 1000 B"):
        read_json(path, max_bytes=1000)
    with pytest.raises(ConfigError, match="more than"):
        read_text(path, max_bytes=1000)


def test_read_json_refuses_deep_nesting_and_huge_numbers_by_name(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 10_000 + "]" * 10_000)
    with pytest.raises(ConfigError, match="nested deeper than the 64 levels"):
        read_json(deep)
    with pytest.raises(ConfigError, match="beyond 64 bits"):
        parse_json('{"seed": -99999999999999999999}', what="config")
    with pytest.raises(ConfigError, match="not valid JSON"):
        parse_json("{'single': 'quotes'}", what="config")


def test_read_text_names_bytes_that_are_not_utf8_and_a_false_gz(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match=r"line 2 is not UTF-8 text \(byte 0xe9\)"):
        read_text(path)
    fake = tmp_path / "plain.jsonl.gz"
    fake.write_text('{"a": 1}\n')
    with pytest.raises(ConfigError, match="not a complete gzip file"):
        read_text(fake)


def test_a_path_longer_than_the_file_system_allows_is_named(tmp_path):
    with pytest.raises(ConfigError, match="longer than the file system allows"):
        check_input(tmp_path / ("x" * 300))
