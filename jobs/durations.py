"""Durations as the sentences of the ledger and the console say them: "90 s", "25 min",
"2 h 5 min", "3 d 4 h" (two units at most, rounded down)."""

UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def say(seconds: float) -> str:
    left = max(0, int(seconds))
    parts: list[str] = []
    for name, size in UNITS:
        if left >= size or (name == "s" and not parts):
            parts.append(f"{left // size} {name}")
            left %= size
        elif parts:
            break  # "2 h 5 min", never "2 h 0 min 5 s"
        if len(parts) == 2:
            break
    return " ".join(parts)


def time_limit_reason(limit_s: int, ran_s: float) -> str:
    """The status reason of a job stopped at its time limit."""
    return f"time limit reached: ran {say(ran_s)}, its limit is {say(limit_s)}"
