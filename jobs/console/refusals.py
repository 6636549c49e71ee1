"""How a console form answers a refusal: a NotFound is a 404 page and a Forbidden a 403 page
(as the API's 404 and 403), any other refusal a message on the page the form came from, or,
for a form that gives `again`, that page shown at once with the refusal's status (400 for bad
input, as the API answers) and the form as it was filled in."""

from collections.abc import Callable

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseRedirect

from jobs.errors import ApiError, Forbidden, NotFound


def act(
    request,
    action: Callable[[], str],
    back: str,
    again: Callable[[int], HttpResponse] | None = None,
) -> HttpResponse:
    """Run `action` (it returns the sentence to show when done) and go back to `back`; on a
    refusal, `again(status)` renders the form's page when given."""
    try:
        done = action()
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    except Forbidden as exc:
        raise PermissionDenied(exc.detail) from exc
    except ApiError as exc:
        messages.error(request, exc.detail)
        if again is not None:
            return again(exc.status)
    else:
        messages.success(request, done)
    return HttpResponseRedirect(back)
