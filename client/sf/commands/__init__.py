"""The `sf` commands, one module per noun: each adds its parser (`add_parser`) and holds the
handlers that parser names (`cmd_*`); `sf.cli` builds the tree and runs the handler.

`common` is what they share; `arrays` serves both `sf submit` and `sf job`. Only argparse,
json, os and sys load with them: HTTP, snapshots and rich load inside the commands that use
them, so `sf --help` and `sf job status` stay fast.
"""
