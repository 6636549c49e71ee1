"""The ledger's indexes are the ones its models declare, no more and no fewer, on the database
the suite runs on: migrations that change indexes in SQL of their own (0029 drops the foreign
keys' single-column copies of composite indexes) must leave the database as the models say."""

from importlib import import_module

import pytest
from django.apps import apps
from django.db import connection

pytestmark = pytest.mark.django_db
DROPPED = import_module("jobs.migrations.0029_fk_indexes_the_composites_cover").INDEXES


def _declared(model) -> set[tuple[str, ...]]:
    """The columns of each non-unique index the model asks for."""
    meta = model._meta
    out = set()
    for field in meta.local_concrete_fields:
        text = (field.db_type(connection) or "").startswith(("varchar", "text"))
        if field.db_index and not field.unique:
            out.add((field.column,))
        # PostgreSQL adds a pattern-ops copy for LIKE to every indexed or unique text column
        # (a primary key too).
        if connection.vendor == "postgresql" and text and (field.db_index or field.unique):
            out.add((field.column,))
    for index in meta.indexes:
        out.add(tuple(meta.get_field(name.lstrip("-")).column for name in index.fields))
    return out


def _present(table: str) -> dict[str, tuple[str, ...]]:
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, table)
    return {
        name: tuple(c["columns"])
        for name, c in found.items()
        if c["index"] and not c["unique"] and not c["primary_key"]
    }


@pytest.mark.parametrize(
    "model", list(apps.get_app_config("jobs").get_models()), ids=lambda m: m.__name__
)
def test_the_database_has_the_indexes_the_model_declares(model):
    present = set(_present(model._meta.db_table).values())
    assert present == _declared(model)


@pytest.mark.parametrize("name,table,column,covering", DROPPED, ids=[d[0] for d in DROPPED])
def test_a_dropped_index_is_gone_and_a_composite_one_leads_with_its_column(
    name, table, column, covering
):
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    assert name not in constraints
    assert constraints[covering]["columns"][0] == column
