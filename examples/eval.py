"""Follow-on `eval` job: scores the parent run's latest checkpoint (a toy metric)."""

import json
import os
import sys

from train import CKPT_RE


def main() -> int:
    ckpt_dir = os.path.join(os.environ["SF_PARENT_OUTPUT_DIR"], "checkpoints")
    steps = sorted(int(m.group(1)) for n in os.listdir(ckpt_dir) if (m := CKPT_RE.match(n)))
    if not steps:
        print(f"no checkpoint in {ckpt_dir}", file=sys.stderr)
        return 1
    with open(os.path.join(ckpt_dir, f"ckpt-{steps[-1]}.json")) as fh:
        checkpoint = json.load(fh)
    print(f"eval step {checkpoint['step']} accuracy {1.0 - checkpoint['loss'] / 2.05:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
