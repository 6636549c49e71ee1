"""The API's JSON renderer (jobs.api.renderer) writes what ninja's own encoder would: dates and
times as Django's ECMA-262 strings, the rest as JSON, whichever encoder took each value."""

import datetime as dt
import decimal
import json
import uuid
import zoneinfo

import pytest
from ninja.responses import NinjaJSONEncoder

from jobs.api.renderer import RENDERER

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(
    "value",
    [
        dt.datetime(2026, 12, 4, 18, 0, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 4, 18, 0, 1, 123456, tzinfo=dt.UTC),
        dt.datetime(2026, 7, 4, 18, 0, 1, 999, tzinfo=BERLIN),
        dt.datetime(2026, 12, 4, 18, 0),  # naive
        dt.datetime(2026, 12, 4, 18, 0, 0, 5),  # naive, a microsecond part
        dt.datetime(2026, 1, 1, 0, 0, 0, 500, tzinfo=dt.timezone(-dt.timedelta(hours=5.5))),
        dt.date(2026, 12, 4),
        dt.timedelta(seconds=90061.5),
        decimal.Decimal("1.10"),
        uuid.UUID(int=7),
        {"nested": [dt.datetime(2026, 1, 1, tzinfo=dt.UTC), None, 2**70]},  # past 64 bits
    ],
)
def test_the_renderer_writes_what_ninjas_encoder_writes(value):
    rendered = RENDERER.render(None, {"value": value}, response_status=200)
    assert json.loads(rendered) == json.loads(json.dumps({"value": value}, cls=NinjaJSONEncoder))
