"""PostgreSQL timestamps read by psycopg's C loader rather than Django's Python one.

Django (5.2 on psycopg 3) registers on every connection a `timestamptz` loader written in Python
(`BaseTzLoader`: psycopg's pure-Python parser, then `replace(tzinfo=...)`), so that each value
comes back in the connection's Django time zone. On the 2-core machines that costs ~12 µs a
value: a page of 50 jobs reads a few hundred, a reconcile tick over 1,000 waiting jobs 2,000
(34 ms of its 43 ms read).

When Django wants UTC (USE_TZ with TIME_ZONE "UTC", as `starforge.settings` fixes) and the
session's TimeZone is UTC (Django sets it when it connects), psycopg's own loader (its C one
where psycopg-binary is installed) returns the very same values: aware, with tzinfo
`datetime.timezone.utc`. `UtcLoader` is Django's class, so Django's per-cursor check
(`tzloader.timezone`) still sees UTC and keeps it, with psycopg's `load` inside. On any other
time zone it is Django's loader unchanged.
"""

import datetime as dt

import psycopg
from django.db.backends.postgresql.psycopg_any import BaseTzLoader
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from psycopg.pq import Format

TIMESTAMPTZ = psycopg.adapters.types["timestamptz"].oid
# The class psycopg itself registers by default: its C loader when the binary package is there.
PSYCOPG_LOADER = psycopg.adapters.get_loader(TIMESTAMPTZ, Format.TEXT)


class UtcLoader(BaseTzLoader):
    timezone = dt.UTC

    def __init__(self, oid: int, context=None):
        super().__init__(oid, context)
        session = self.connection.info.timezone if self.connection is not None else None
        if session is dt.UTC:  # else Django's load, converting to UTC
            self.load = PSYCOPG_LOADER(oid, context).load  # type: ignore[method-assign, misc]


@receiver(connection_created, dispatch_uid="jobs.pgtime")
def use_psycopg_loader(sender, connection, **kwargs) -> None:
    if connection.vendor == "postgresql" and connection.timezone is dt.UTC:
        connection.connection.adapters.register_loader("timestamptz", UtcLoader)
