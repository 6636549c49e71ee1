"""The audit log's doors that Django signals open: sign-in, sign-out and failed sign-ins
(wherever they happen: the console, the admin, an OpenID backend that uses `django.contrib.auth`),
and the Django admin.

The admin is recorded by what it does to rows, not by its own LogEntry (whose bulk writes send
no signal): during a request under /admin/, every save, delete and many-to-many change of a
model the admin shows (its ModelAdmins and their inlines) writes a row, with the row's fields
before and after (secrets left out: `jobs.audit.SECRET_FIELDS`). Connected by `jobs.apps`.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db import models
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save

from jobs import audit
from jobs.audited import AuditEntry

ADMIN_PREFIX = "/admin/"


def signed_in(sender, request, user, **kwargs) -> None:
    audit.record(user, "user.sign_in", user, request=request)


def signed_out(sender, request, user, **kwargs) -> None:
    if user is not None:
        audit.record(user, "user.sign_out", user, request=request)


def sign_in_failed(sender, credentials, request=None, **kwargs) -> None:
    name = str((credentials or {}).get("username", ""))[:150]
    audit.record(
        name or None, "user.sign_in_failed", audit.Target("user", "", name), request=request
    )


def _admin_call() -> audit.Call | None:
    call = audit.current()
    if call is None or not call.request.path.startswith(ADMIN_PREFIX):
        return None
    user = getattr(call.request, "user", None)
    return call if user is not None and user.is_authenticated else None


def _shown_models() -> set[type[models.Model]]:
    shown = set()
    for model, model_admin in admin.site._registry.items():
        shown.add(model)
        shown.update(inline.model for inline in model_admin.inlines)
    return shown


def _watched(sender) -> bool:
    return sender is not AuditEntry and sender in _shown_models()


def before_save(sender, instance, raw=False, update_fields=None, **kwargs) -> None:
    call = _admin_call()
    if call is None or raw or not _watched(sender) or instance.pk is None:
        return
    old = sender._default_manager.filter(pk=instance.pk).first()
    if old is not None:
        call.extra.setdefault("admin_before", {})[(sender, str(instance.pk))] = audit.state_of(old)


def after_save(sender, instance, created=False, raw=False, update_fields=None, **kwargs) -> None:
    call = _admin_call()
    if call is None or raw or not _watched(sender):
        return
    if update_fields is not None and set(update_fields) == {"last_login"}:
        return  # a sign-in's own write; recorded as the sign-in
    old = call.extra.get("admin_before", {}).pop((sender, str(instance.pk)), None)
    new = audit.state_of(instance)
    before: dict | None
    after: dict | None
    if created:
        action, before, after = "add", None, new
    else:
        action, (before, after) = "change", audit.changed(old, new)
    audit.record(call.request.user, f"admin.{_name(sender)}.{action}", instance, before, after)


def after_delete(sender, instance, **kwargs) -> None:
    call = _admin_call()
    if call is None or not _watched(sender):
        return
    before = audit.state_of(instance)
    audit.record(call.request.user, f"admin.{_name(sender)}.delete", instance, before, None)


def after_m2m(sender, instance, action, model, pk_set, **kwargs) -> None:
    call = _admin_call()
    if call is None or action not in ("post_add", "post_remove", "post_clear"):
        return
    if not _watched(type(instance)):
        return
    ids = sorted(pk_set or [])
    change = {f"{model._meta.model_name}_{action.removeprefix('post_')}": ids}
    verb = f"admin.{_name(type(instance))}.change"
    audit.record(call.request.user, verb, instance, None, change)


def _name(model: type[models.Model]) -> str:
    return model._meta.model_name or "row"


def connect() -> None:
    user_logged_in.connect(signed_in, dispatch_uid="audit_sign_in")
    user_logged_out.connect(signed_out, dispatch_uid="audit_sign_out")
    user_login_failed.connect(sign_in_failed, dispatch_uid="audit_sign_in_failed")
    pre_save.connect(before_save, dispatch_uid="audit_admin_before")
    post_save.connect(after_save, dispatch_uid="audit_admin_save")
    post_delete.connect(after_delete, dispatch_uid="audit_admin_delete")
    m2m_changed.connect(after_m2m, dispatch_uid="audit_admin_m2m")
