"""Timestamps read through psycopg's loader (jobs.pgtime) are the ones Django's own gives."""

import datetime as dt

import pytest
from django.db import connection
from django.db.backends.postgresql.psycopg_any import register_tzloader
from psycopg.pq import Format

from jobs.pgtime import PSYCOPG_LOADER, TIMESTAMPTZ, UtcLoader

pytestmark = [pytest.mark.django_db, pytest.mark.postgres]

SAMPLES = """
    SELECT t FROM (VALUES
        ('2026-12-01 23:59:59.999999+00'::timestamptz),
        ('2026-03-29 01:30:00.5+02'),
        ('1970-01-01 00:00:00+00'),
        ('0001-01-01 00:00:00+00'),
        ('9999-12-31 23:59:59.000001+00'),
        ('2024-02-29 12:00:00-09:30'),
        (NULL)
    ) AS v(t)
"""


def read(cursor) -> list:
    cursor.execute(SAMPLES)
    return [row[0] for row in cursor.fetchall()]


def test_django_cursors_read_timestamps_with_psycopgs_loader_and_the_same_values():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    with connection.cursor() as cursor:
        loader = cursor.connection.adapters.get_loader(TIMESTAMPTZ, Format.TEXT)
        fast = read(cursor)
    assert loader is UtcLoader
    with connection.cursor() as cursor:
        register_tzloader(dt.UTC, cursor.cursor)  # Django's own, on this cursor only
        slow = read(cursor)
    assert fast == slow and fast[-1] is None
    assert all(value.tzinfo is dt.UTC for value in fast[:-1])
    assert fast[1] == dt.datetime(2026, 3, 28, 23, 30, 0, 500000, tzinfo=dt.UTC)


def test_the_loader_inside_is_psycopgs_own_only_on_a_utc_session():
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only")
    with connection.cursor() as cursor:
        utc = UtcLoader(TIMESTAMPTZ, cursor.cursor)
        assert type(utc.load.__self__) is PSYCOPG_LOADER
        cursor.execute("SET TIME ZONE 'Europe/Paris'")
        try:
            other = UtcLoader(TIMESTAMPTZ, cursor.cursor)
            assert getattr(other.load, "__self__", None) is other  # Django's load, unchanged
        finally:
            cursor.execute("SET TIME ZONE 'UTC'")
