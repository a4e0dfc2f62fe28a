"""What checkpoint verification costs: write a DCP checkpoint of a few GB, time hashing it, delete it.

    python scripts/bench_checkpoint_verify.py [--gb 3] [--dir /tmp] [--threads 1 2 4]

Writes random fp32 tensors (the size of a model + Adam state) with dcp.save into a temporary
directory, then times (1) recording the checksums as a save does (integrity.describe_files),
(2) verifying them as resume does (integrity.check_files), (3) dcp.load of the same state for
comparison, and prints MB/s. The files were just written, so they are read from the page cache:
the numbers are the hashing cost; on a cold network filesystem the read bandwidth bounds both
verification and loading alike. The directory is removed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from trainer.checkpoint import integrity


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=3.0, help="checkpoint size in GB (1e9 bytes)")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write the temporary checkpoint")
    args = parser.parse_args(argv)

    tensor_bytes = 256 << 20
    count = max(1, round(args.gb * 1e9 / tensor_bytes))
    state = {f"tensor_{i}": torch.randn(tensor_bytes // 4) for i in range(count)}
    root = Path(tempfile.mkdtemp(prefix="bench_verify_", dir=args.dir))
    try:
        started = time.perf_counter()
        dcp.save(state, checkpoint_id=str(root), no_dist=True)
        write_s = time.perf_counter() - started
        names = sorted(p.name for p in root.iterdir())
        total = sum((root / name).stat().st_size for name in names)

        started = time.perf_counter()
        files = integrity.describe_files(root, names)
        record_s = time.perf_counter() - started
        started = time.perf_counter()
        problems = integrity.check_files(root, files, hash_files=True)
        verify_s = time.perf_counter() - started
        assert not problems, problems
        started = time.perf_counter()
        integrity.check_files(root, files, hash_files=False)
        sizes_s = time.perf_counter() - started
        loaded = {name: torch.empty_like(value) for name, value in state.items()}
        started = time.perf_counter()
        dcp.load(loaded, checkpoint_id=str(root), no_dist=True)
        load_s = time.perf_counter() - started
    finally:
        shutil.rmtree(root, ignore_errors=True)

    mb = total / 1e6
    print(f"checkpoint: {total / 1e9:.2f} GB in {len(names)} files ({root})")
    print(f"dcp.save          {write_s:7.2f} s  {mb / write_s:8.0f} MB/s")
    print(f"record sha256     {record_s:7.2f} s  {mb / record_s:8.0f} MB/s")
    print(f"verify sha256     {verify_s:7.2f} s  {mb / verify_s:8.0f} MB/s")
    print(f"verify sizes only {sizes_s:7.4f} s  (checkpoint.verify=false)")
    print(f"dcp.load          {load_s:7.2f} s  {mb / load_s:8.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
