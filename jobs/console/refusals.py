"""How a console form answers a refusal: a NotFound is a 404 page and a Forbidden a 403 page
(as the API's 404 and 403), any other refusal a message on the page the form came from."""

from collections.abc import Callable

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect

from jobs.errors import ApiError, Forbidden, NotFound


def act(request, action: Callable[[], str], back: str) -> HttpResponseRedirect:
    """Run `action` (it returns the sentence to show when done) and go back to `back`."""
    try:
        done = action()
    except NotFound as exc:
        raise Http404(exc.detail) from exc
    except Forbidden as exc:
        raise PermissionDenied(exc.detail) from exc
    except ApiError as exc:
        messages.error(request, exc.detail)
    else:
        messages.success(request, done)
    return HttpResponseRedirect(back)
