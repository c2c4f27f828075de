#!/usr/bin/env python3
"""Writes the Parquet test fixtures of tests/data/parquet_rows_test.cpp into tests/fixtures/parquet/.

Each <name>.parquet that dschat reads successfully gets <name>.expected.json next to it: pyarrow's
own `table.to_pylist()`, the reference that `data::read_parquet_rows` must reproduce, with the two
Python-only shapes made JSON the way dschat defines them (map entries (k, v) -> {"key", "value"};
bytes -> their UTF-8 text).
Usage: .venv/bin/python tools/make_parquet_fixtures.py   (rewrites the files; the outputs are committed)
"""
import datetime
import decimal
import json
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "parquet"


def all_types_table():
    # Shapes of the DeepSpeed-Chat datasets (openai/webgpt_comparisons' `question` and `quotes_0`,
    # chat turns as list<struct>) plus every scalar type the reader converts, with nulls placed
    # at every level: a null row value, a null list, a null list element, a null struct field.
    question = pa.struct([("full_text", pa.string()), ("id", pa.string()), ("dataset", pa.string())])
    quotes = pa.struct([("title", pa.list_(pa.string())), ("extract", pa.list_(pa.string()))])
    nested = pa.struct([("meta", pa.struct([("a", pa.int64()), ("b", pa.string())])), ("n", pa.int32())])
    turn = pa.struct([("role", pa.string()), ("content", pa.string())])
    columns = {
        "id": pa.array([0, -9223372036854775808, 9223372036854775807, 3], pa.int64()),
        "i32": pa.array([1, None, -2147483648, 2147483647], pa.int32()),
        "i8": pa.array([-128, 127, 0, None], pa.int8()),
        "u16": pa.array([0, 65535, None, 7], pa.uint16()),
        "u64": pa.array([18446744073709551615, 0, None, 42], pa.uint64()),
        "f64": pa.array([0.1, -2.5e300, None, 1e-310], pa.float64()),
        "f32": pa.array([0.1, -1.25, 3.4e38, None], pa.float32()),
        "flag": pa.array([True, False, None, True], pa.bool_()),
        "text": pa.array(["plain", "Grüße, 世界 😀🎉", None, ""], pa.string()),
        "large_text": pa.array(["long \"quoted\"\n\ttext", None, "\u0000nul inside", "é"], pa.large_string()),
        "category": pa.array(["chosen", "rejected", None, "chosen"], pa.string()).dictionary_encode(),
        "blob": pa.array([b"utf-8 bytes \xe2\x9c\x93", None, b"", b"x"], pa.binary()),
        "fixed_blob": pa.array([b"ab", b"cd", None, b"ef"], pa.binary(2)),
        "nothing": pa.nulls(4),
        "tags": pa.array([["a", "b"], [], None, ["c", None]], pa.list_(pa.string())),
        "scores": pa.array([[1.5], None, [], [2.0, -3.0]], pa.large_list(pa.float64())),
        "pair": pa.array([[1, 2], [3, 4], None, [5, None]], pa.list_(pa.int32(), 2)),
        "question": pa.array([
            {"full_text": "Why is the sky blue?", "id": "q0", "dataset": "eli5"},
            {"full_text": "¿Qué?", "id": None, "dataset": "trivia_qa"},
            None,
            {"full_text": "", "id": "q3", "dataset": None},
        ], question),
        "quotes_0": pa.array([
            {"title": ["Rayleigh scattering"], "extract": ["Light is scattered …"]},
            {"title": [], "extract": []},
            {"title": None, "extract": ["only extract"]},
            None,
        ], quotes),
        "nested": pa.array([
            {"meta": {"a": 1, "b": "x"}, "n": 10},
            {"meta": None, "n": 11},
            {"meta": {"a": None, "b": "z"}, "n": None},
            None,
        ], nested),
        "turns": pa.array([
            [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello 👋"}],
            [],
            None,
            [{"role": "user", "content": None}, None],
        ], pa.list_(turn)),
        "attrs": pa.array([[("k", 1), ("l", 2)], [], None, [("only", None)]], pa.map_(pa.string(), pa.int64())),
    }
    return pa.table(columns)


def row_groups_table():
    n = 130
    return pa.table({
        "id": pa.array(range(n), pa.int64()),
        "prompt": pa.array([f"Human: question {i}?" if i % 7 else None for i in range(n)], pa.string()),
        "ids": pa.array([list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),
        "kind": pa.array(["even" if i % 2 == 0 else "odd" for i in range(n)]).dictionary_encode(),
    })


def unsupported_table():
    return pa.table({
        "id": pa.array([1, 2], pa.int64()),
        "when": pa.array([datetime.datetime(2023, 4, 1), None], pa.timestamp("ms")),
        "price": pa.array([decimal.Decimal("1.25"), None], pa.decimal128(5, 2)),
    })


def not_utf8_table():
    return pa.table({"ok": pa.array(["a", "b"]), "raw": pa.array([b"fine", b"\xff\xfe not text"], pa.binary())})


def jsonable(value):
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return [{"key": jsonable(k), "value": jsonable(v)} for k, v in value]
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    return value


def write(name, table, **options):
    path = OUT / f"{name}.parquet"
    pq.write_table(table, path, **options)
    back = pq.read_table(path)  # the oracle is what a reader gets from the file, not the input
    return path, back


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, table, options in [("all_types", all_types_table(), {}),
                                 ("row_groups", row_groups_table(), {"row_group_size": 40})]:
        path, back = write(name, table, **options)
        rows = [jsonable(r) for r in back.to_pylist()]
        expected = OUT / f"{name}.expected.json"
        lines = [json.dumps(r, ensure_ascii=False, allow_nan=False) for r in rows]  # one row a line
        expected.write_text("[\n" + ",\n".join(lines) + "\n]\n")
        print(f"{path.name}: {back.num_rows} rows, {pq.ParquetFile(path).num_row_groups} row groups")
    write("unsupported", unsupported_table())
    write("not_utf8", not_utf8_table())
    (OUT / "not_parquet.parquet").write_text("id,text\n1,this is CSV, not Parquet\n")


if __name__ == "__main__":
    main()
