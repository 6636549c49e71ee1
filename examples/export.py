"""Follow-on `export` job: copies the parent run's latest checkpoint into this run's outputs."""

import os
import shutil
import sys

from train import CKPT_RE


def main() -> int:
    ckpt_dir = os.path.join(os.environ["SF_PARENT_OUTPUT_DIR"], "checkpoints")
    steps = sorted(int(m.group(1)) for n in os.listdir(ckpt_dir) if (m := CKPT_RE.match(n)))
    if not steps:
        print(f"no checkpoint in {ckpt_dir}", file=sys.stderr)
        return 1
    os.makedirs(os.environ["SF_OUTPUT_DIR"], exist_ok=True)
    target = os.path.join(os.environ["SF_OUTPUT_DIR"], "model.json")
    shutil.copyfile(os.path.join(ckpt_dir, f"ckpt-{steps[-1]}.json"), target)
    print(f"exported step {steps[-1]} to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
