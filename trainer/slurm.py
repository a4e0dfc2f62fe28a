"""Where the SLURM launcher is: `python -m trainer.slurm` prints the path of trainer/slurm_train.sh.

    sbatch --nodes=16 "$(python -m trainer.slurm)" +experiment=nvfp4_12b data.prepared_dir=/lustre/shards
    cp "$(python -m trainer.slurm)" my_cluster_train.sh        # a copy to adapt the #SBATCH lines

The script is installed with the package (the wheel carries it beside this module), so the line
above works from a wheel as from a checkout; sbatch copies it when the job is submitted. It runs one
torchrun per node, and torchrun one `python -m trainer` per GPU; its header says what it sets.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("slurm_train.sh")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.slurm", description=__doc__.split("\n")[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.parse_args(argv)
    print(SCRIPT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
