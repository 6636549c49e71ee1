"""Hot reads whose SQL is built once per process, not once per request.

Django turns a QuerySet into SQL anew each time one is evaluated. For the API's small reads that
costs far more than running the SQL: a job read spent ~0.6 ms building its query and 0.05 ms
running it. A `Prepared` read builds its QuerySet once per shape, with a stand-in value where
each request's parameter goes, keeps the SQL and the row converters Django chose for this
database, and runs that SQL with the request's values put where the stand-ins were. The query
is still written with the ORM, so the SQL is the one Django would send for the same QuerySet.

Rows are converted as Django converts them, a column at a time, with one-argument stand-ins for
the converters hot reads meet on every row (SQLite's text datetimes, JSON): a page of 50 jobs
made some 650 converter calls through Django's generic loop, about a fifth of the page's time.

Parameters are ints, strs, dates and aware datetimes. An int or str is its own database value;
a date or datetime is turned into one as Django turns a DateField's or DateTimeField's value
(on SQLite, text). Every stand-in must reach the SQL as a parameter (not a LIMIT, which Django
writes inline), or building the read fails.
"""

import datetime as dt
import functools
import json
import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from django.conf import settings
from django.contrib.auth.models import User
from django.core.signals import setting_changed
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorWrapper
from django.db.models import JSONField, Model, QuerySet
from django.db.models.fields.json import KeyTransform
from django.dispatch import receiver
from django.utils.dateparse import parse_datetime

# Distinct per parameter and from any constant a read's own SQL holds; the int ones inside the
# range of every integer column (Django refuses to build a lookup of an out-of-range value).
_INT_STAND_IN = 2_140_000_000
_STR_STAND_IN = "\x00starforge-parameter-"
_DATE_STAND_IN = dt.date(1901, 1, 1)  # a day no ledger holds: Starforge did not exist
_DATETIME_STAND_IN = dt.datetime(1901, 1, 1, tzinfo=dt.UTC)
Value = int | str | dt.date | dt.datetime
T = TypeVar("T")


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple
    # (index in params, parameter name, what makes a request's value the database's: for an
    # int or str the type Django gave the stand-in (on PostgreSQL an int column's value comes
    # typed, e.g. psycopg's Int4, and each request's is typed alike); for a date or datetime
    # Django's own adapter)
    slots: tuple[tuple[int, str, Callable], ...]
    converters: tuple[tuple[int, Callable[[Any], Any]], ...]  # (column, its conversion)


class Prepared:
    """One read: `build(shape, **stand_ins)` returns its QuerySet (a `.values_list()` of the
    columns wanted); `rows(shape, **values)` runs it. `shape` is what changes the SQL itself
    (which filters apply, a LIMIT), `values` what changes only its parameters; the same shape
    is always given the same parameter names."""

    def __init__(self, build: Callable[..., QuerySet]):
        self._build = build
        self._compiled: dict[Hashable, _Compiled] = {}

    def rows(self, shape: Hashable = (), /, **values: Value) -> list[list]:
        compiled, fetched = self._fetch(shape, values)
        if not compiled.converters or not fetched:
            return [list(row) for row in fetched]
        columns = list(zip(*fetched, strict=True))
        for index, convert in compiled.converters:
            columns[index] = tuple(map(convert, columns[index]))
        return [list(row) for row in zip(*columns, strict=True)]

    def built(self, memo: "RowMemo[T]", shape: Hashable = (), /, **values: Value) -> list[T]:
        """`memo`'s function of each row (as `rows` gives it), worked out once for each row the
        database sends as `memo` last saw it: only rows not seen before are converted."""
        compiled, fetched = self._fetch(shape, values)
        return [memo.of(raw, compiled.converters) for raw in fetched]

    def _fetch(self, shape: Hashable, values: dict[str, Value]) -> tuple["_Compiled", list]:
        compiled = self._compiled.get(shape)
        if compiled is None:
            compiled = self._compiled[shape] = self._compile(shape, values)
        params = list(compiled.params)
        for index, name, kind in compiled.slots:
            params[index] = kind(values[name])
        with _cursor() as cursor:
            cursor.execute(compiled.sql, params)
            return compiled, cursor.fetchall()

    def _compile(self, shape: Hashable, values: dict[str, Value]) -> _Compiled:
        stand_ins = {name: _stand_in(i, value) for i, (name, value) in enumerate(values.items())}
        queryset = self._build(shape, **stand_ins)
        if queryset.db != DEFAULT_DB_ALIAS:
            raise ValueError(f"a prepared read runs on {DEFAULT_DB_ALIAS}, not {queryset.db}")
        compiler = queryset.query.get_compiler(using=queryset.db)
        sql, params = compiler.as_sql()
        # The stand-ins as they reach the SQL: a date's or datetime's adapted as Django does.
        adapters = {name: _adapter(value) for name, value in stand_ins.items()}
        by_value = {}
        for name, value in stand_ins.items():
            adapt = adapters[name]
            by_value[adapt(value) if adapt else value] = name
        slots = tuple(
            (i, by_value[p], adapters[by_value[p]] or type(p))
            for i, p in enumerate(params)
            if isinstance(p, Hashable) and not isinstance(p, bool) and p in by_value
        )
        missing = set(stand_ins) - {name for _, name, _ in slots}
        if missing:
            raise ValueError(f"parameters {sorted(missing)} do not reach the SQL as parameters")
        fields = [column[0] for column in compiler.select[: compiler.col_count]]
        converters = tuple(
            (index, _conversion(convs, expression, compiler.connection))
            for index, (convs, expression) in compiler.get_converters(fields).items()
        )
        return _Compiled(sql, tuple(params), slots, converters)


class RowMemo(Generic[T]):
    """What a pure function of a read's row gave, kept by the row as the database sent it: a
    row sent again unchanged (a page of jobs listed again, most of whose jobs did not move) is
    neither converted nor built again. Any column that changes makes a new row, so what is kept
    is never stale, only unused; the oldest of `size` rows gives way first.

    `build` must depend only on the row and on settings (all kept rows are dropped when a
    setting changes, as a test's `override_settings` does). Every read built through one memo
    must select the same columns. What it gives is shared by every answer that meets the row,
    so nobody may change it. Rows are compared as Python compares tuples, so 30 and 30.0 in a
    column are the same value: a build must not tell them apart (the job reads' only numbers
    that could be either come from cluster settings, where validation keeps them whole)."""

    def __init__(self, build: Callable[[list], T], size: int):
        self._build = build
        self._size = size
        self._kept: dict[tuple, T] = {}
        self._keeping = threading.Lock()
        _MEMOS.add(self)

    def of(self, raw: tuple, converters: tuple[tuple[int, Callable[[Any], Any]], ...]) -> T:
        try:
            return self._kept[raw]
        except KeyError:
            pass
        except TypeError:  # a column value that cannot be a key (bytes come as memoryview)
            return self._build(_converted(raw, converters))
        made = self._build(_converted(raw, converters))
        with self._keeping:  # the web server's threads share the memo
            self._kept[raw] = made
            if len(self._kept) > self._size:
                del self._kept[next(iter(self._kept))]
        return made

    def clear(self) -> None:
        with self._keeping:
            self._kept.clear()


_MEMOS: "weakref.WeakSet[RowMemo]" = weakref.WeakSet()


@receiver(setting_changed)
def _forget_rows(**kwargs: Any) -> None:
    for memo in list(_MEMOS):
        memo.clear()


def _converted(raw: tuple, converters: tuple[tuple[int, Callable[[Any], Any]], ...]) -> list:
    row = list(raw)
    for index, convert in converters:
        row[index] = convert(row[index])
    return row


def _conversion(convs: list[Callable], expression: Any, connection: Any) -> Callable[[Any], Any]:
    """A column's converters as one function of its value: Django's own, in their order, each
    known one replaced by a function that answers as it does."""
    steps = [_known(convert, expression, connection) for convert in convs]
    if len(steps) == 1:
        return steps[0]

    def chained(value: Any) -> Any:
        for step in steps:
            value = step(value)
        return value

    return chained


def _known(convert: Callable, expression: Any, connection: Any) -> Callable[[Any], Any]:
    method = getattr(convert, "__func__", None)
    owner = getattr(convert, "__self__", None)
    if connection.vendor == "sqlite" and method is _sqlite_operations().convert_datetimefield_value:
        return _sqlite_datetime(connection.timezone if settings.USE_TZ else None)
    if method is JSONField.from_db_value and getattr(owner, "decoder", None) is None:
        return _json(keyed=isinstance(expression, KeyTransform))
    return lambda value: convert(value, expression, connection)


def _sqlite_operations() -> Any:
    from django.db.backends.sqlite3.operations import DatabaseOperations  # needs sqlite3

    return DatabaseOperations


def _sqlite_datetime(zone: dt.tzinfo | None) -> Callable[[Any], Any]:
    """SQLite's text datetimes, as `convert_datetimefield_value`: parsed, and made aware in
    the connection's zone when USE_TZ is on and the text gives none."""

    def convert(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            value = parse_datetime(value)
        if zone is not None and value.utcoffset() is None:
            value = value.replace(tzinfo=zone)
        return value

    return convert


def _json(keyed: bool) -> Callable[[Any], Any]:
    """A JSON column, as `JSONField.from_db_value` without a decoder. (Not orjson: it reads an
    int past 64 bits as a float.)"""

    def convert(value: Any) -> Any:
        if value is None:
            return None
        if keyed and not isinstance(value, str):  # SQLite extracts scalars as SQL values
            return value
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value

    return convert


def _cursor():
    """A cursor for a prepared read. On PostgreSQL it binds parameters on the server, so that
    psycopg prepares the statement after a few executions and PostgreSQL plans it once per
    connection: planning the page read's join of eight tables took ~4 ms a request, running it
    ~0.1 ms. (Django's own cursors bind on the client, which PostgreSQL must plan every time.)
    It is the cursor Django uses with the `server_side_binding` option, wrapped as Django wraps
    its cursors (errors are translated the same way). While queries are being logged (DEBUG, a
    test capturing them) Django's own cursor runs the same SQL and parameters instead: Django
    cannot show the text of a prepared statement's run."""
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql" or connection.queries_logged:
        return connection.cursor()
    from django.db.backends.postgresql.base import ServerBindingCursor

    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = ServerBindingCursor(connection.connection)  # type: ignore[call-arg]
        return CursorWrapper(raw, connection)


def _stand_in(index: int, value: Value) -> Value:
    if type(value) is int:
        return _INT_STAND_IN - index
    if type(value) is str:
        return f"{_STR_STAND_IN}{index}"
    if type(value) is dt.datetime and value.tzinfo is not None:
        return _DATETIME_STAND_IN + dt.timedelta(seconds=index)
    if type(value) is dt.date:
        return _DATE_STAND_IN + dt.timedelta(days=index)
    raise TypeError(f"a prepared read takes ints, strs, dates and aware datetimes, not {value!r}")


def _adapter(stand_in: Value) -> Callable | None:
    """Django's conversion of a date's or datetime's value for this database (None: an int's
    or str's value is itself)."""
    ops = connections[DEFAULT_DB_ALIAS].ops
    if isinstance(stand_in, dt.datetime):
        return ops.adapt_datetimefield_value
    if isinstance(stand_in, dt.date):
        return ops.adapt_datefield_value
    return None


def reader(user_id: int, staff: bool) -> User:
    """A user to build a prepared read for: the visibility rules (`visible_jobs`,
    `visible_teams`) read only the user's pk and is_staff."""
    return User(pk=user_id, is_staff=staff)


def columns(model: type[Model], path: str = "") -> tuple[str, ...]:
    """A model's columns as `values_list` paths (through the relation `path`, e.g. "team"),
    for a prepared read that `models_of` makes models of."""
    prefix = f"{path}__" if path else ""
    return tuple(f"{prefix}{name}" for name in _attnames(model))


def models_of(row: list, *models: type[Model]) -> list[Any]:
    """The models a prepared row of `columns(models[0]), columns(models[1], path), ...` holds,
    as a QuerySet would load them (values already converted: `Model.from_db`)."""
    made: list[Any] = []
    start = 0
    for model in models:
        names = _attnames(model)
        made.append(model.from_db(DEFAULT_DB_ALIAS, names, row[start : start + len(names)]))
        start += len(names)
    return made


@functools.cache
def _attnames(model: type[Model]) -> tuple[str, ...]:
    return tuple(field.attname for field in model._meta.concrete_fields)
