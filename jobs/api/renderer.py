"""The API's JSON renderer: orjson, with Django's encoder for what orjson would write otherwise.

A list of 50 jobs spent about a third of its time in `json.dumps`. orjson writes the same JSON
(without the blanks after `,` and `:`) several times faster. Dates and times, dataclasses and
anything else orjson does not take go to ninja's encoder (Django's, plus pydantic models), so
they read as they always did: a datetime as ECMA-262 ISO 8601, to the millisecond, "Z" for UTC.
What orjson refuses (an int past 64 bits, a non-string dict key) is rendered by `json.dumps` as
before: the answer never depends on which encoder took it.
"""

import datetime as dt
from typing import Any

import orjson
from django.http import HttpRequest
from ninja.renderers import JSONRenderer
from ninja.responses import NinjaJSONEncoder

OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


class FastJSONRenderer(JSONRenderer):
    def __init__(self) -> None:
        ninja = NinjaJSONEncoder().default

        def default(value: Any) -> Any:
            # A datetime (several a job) by DjangoJSONEncoder's rule, written out here: ninja's
            # encoder ends in it after four checks of its own types
            # (tests/jobs/test_api_renderer.py holds the two to the same answers).
            if type(value) is not dt.datetime:
                return ninja(value)
            text = value.isoformat()
            if value.microsecond:
                text = text[:23] + text[26:]
            return text[:-6] + "Z" if text.endswith("+00:00") else text

        self._default = default

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> Any:
        try:
            return orjson.dumps(data, default=self._default, option=OPTIONS)
        except orjson.JSONEncodeError:
            return super().render(request, data, response_status=response_status)


RENDERER = FastJSONRenderer()  # the NinjaAPI's (starforge.api), and the views that render alone
