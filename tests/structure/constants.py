"""The constants a module's code holds, read from its source (no import runs): what the tests
that keep a contract's values in one place look for (`tests/client/test_contract.py`,
`tests/structure/test_failure_causes_have_one_name.py`)."""

import ast


def constants(source: str) -> set[object]:
    """The constants in `source`, docstrings and booleans left out (comments are no code)."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and id(node) not in docstrings
        and not isinstance(node.value, bool)
    }
