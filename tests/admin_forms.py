"""Reading a Django admin page's form as a browser would submit it (tests of the admin)."""

from html.parser import HTMLParser


class _Form(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self._select: str | None = None
        self._textarea: str | None = None
        self._in_form = False

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        if tag == "form" and a.get("method", "").lower() == "post":
            self._in_form = True
        if not self._in_form or "name" not in a and tag not in ("option",):
            return
        if tag == "input":
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            if kind in ("submit", "button", "file", "image"):
                return
            self.data.setdefault(a["name"], []).append(
                a.get("value", "on" if kind == "checkbox" else "")
            )
        elif tag == "select":
            self._select = a["name"]
            self.data.setdefault(a["name"], [])
        elif tag == "option" and self._select and "selected" in a:
            self.data[self._select].append(a.get("value", ""))
        elif tag == "textarea":
            self._textarea = a["name"]
            self.data[a["name"]] = [""]

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None
        elif tag == "form":
            self._in_form = False

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea][-1] += data


def change_form(html: str, fill: dict | None = None) -> dict:
    """The form's fields as submitted (one value, or a list for a multiple select), with `fill`
    set on top of them."""
    parser = _Form()
    parser.feed(html)
    data: dict = {k: (v[0] if len(v) == 1 else v) for k, v in parser.data.items()}
    data.pop("csrfmiddlewaretoken", None)
    for key in [k for k, v in data.items() if v == []]:
        del data[key]
    data.update(fill or {})
    return data
