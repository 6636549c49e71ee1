"""`jobs.schemas.text_fault` and `json_fault`: the one rule for what text and JSON a request may
hand on to a job's argv, environment, file names and the ledger."""

import json

import pytest

from jobs.schemas import json_fault, text_fault


@pytest.mark.parametrize("text", ["", "train.py", "é 😀", "tab\tand\nnewline", "\U0010ffff"])
def test_text_any_process_can_take_has_no_fault(text):
    assert text_fault(text) is None


@pytest.mark.parametrize(
    "text, fault",
    [
        ("a\x00b", "must not contain NUL characters"),
        ("\ud800", "must not contain lone surrogates"),
        ("x\udfffy", "must not contain lone surrogates"),
        ("\udc80", "must not contain lone surrogates"),  # what surrogateescape makes of a byte
    ],
)
def test_nul_and_lone_surrogates_are_faults(text, fault):
    assert fault in text_fault(text)


def test_a_json_fault_names_where_it_is():
    value = json.loads('{"grid": [1, {"lr": NaN}], "ok": "x"}')
    assert json_fault(value) == (
        "grid[1].lr must be a finite number (NaN, Infinity and numbers past 1.8e308 are not)"
    )
    assert json_fault({"a": {"b\x00": 1}}) == "a name in a must not contain NUL characters"
    assert json_fault("\ud800").startswith("the value must not contain lone surrogates")


def test_finite_numbers_and_other_json_have_no_fault():
    assert json_fault({"a": [1e308, -1e308, 10**400, 0.0, None, True, {"b": "é"}]}) is None


def test_any_depth_is_walked_without_recursion():
    deep: list = ["ok"]
    for _ in range(100_000):
        deep = [deep]
    assert json_fault(deep) is None
    deep[0] = float("inf")
    assert json_fault(deep) == (
        "[0] must be a finite number (NaN, Infinity and numbers past 1.8e308 are not)"
    )
