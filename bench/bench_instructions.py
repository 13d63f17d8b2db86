"""One configuration of the rewrite benchmark, for counting instructions (deterministic, unlike seconds here).

    for m in none bare 0,0 1,0 1,1; do
      valgrind --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python bench/bench_instructions.py $m \\
        2>&1 | grep refs
    done

MODE: ``none`` (imports and the sample only: subtract it from the others), ``bare`` (the bare loop of
bench_rewrite.py), or ``DEEP,PROOF`` with 0/1 each (the rewriter with deep validation / proof on or off).
The sample is a 4 MiB segment of JSON-like values in ~16 KiB snappy batches, built the same way each run.
"""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_rewrite import bare_loop

from tiering.demo.sample import write_segment
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment


def main(mode: str) -> None:
    sample = io.BytesIO()
    write_segment(sample, base_offset=0, kind="json", codec=Codec.SNAPPY, target_bytes=4 << 20, seed=7)
    data = sample.getvalue()
    if mode == "none":
        return
    if mode == "bare":
        bare_loop(data)
        return
    deep, proof = (flag == "1" for flag in mode.split(","))
    with open(os.devnull, "wb") as sink:  # as bench_rewrite.py: real writes, the bytes going nowhere
        rewrite_segment(io.BytesIO(data), sink, base_offset=0,
                        options=RewriteOptions(Codec.ZSTD, 3, deep_validation=deep, proof=proof))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "none")
