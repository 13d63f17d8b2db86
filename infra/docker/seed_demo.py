"""Seed the compose stack's S3 (a moto server) with the demo ``logdir`` tree, once.

Run by the ``s3-seed`` service of docker-compose.yml after the ``s3`` service is healthy: creates the
demo bucket and uploads what ``make demo`` uploads (``tiering.demo.s3.seed_demo``: snappy, lz4, gzip,
uncompressed, zstd and incompressible topics, an index-less and a corrupt segment,
``__consumer_offsets``). If the prefix already holds objects (``docker compose up`` again while the
moto server kept running), it changes nothing: re-seeding would put the originals back over segments
a run had compacted. The endpoint and (dummy) credentials come from the AWS environment; TIERING_BUCKET
and TIERING_PREFIX, the DAG's defaults, must name the demo's bucket and prefix.
"""

from __future__ import annotations

import os
import sys

from tiering.demo.s3 import BUCKET, PREFIX, seed_demo
from tiering.storage.s3 import S3Store, make_client


def main() -> int:
    wanted = (os.environ.get("TIERING_BUCKET", BUCKET), os.environ.get("TIERING_PREFIX", PREFIX).strip("/"))
    if wanted != (BUCKET, PREFIX):
        print(f"seed: TIERING_BUCKET/TIERING_PREFIX are {wanted}, but the demo seeds s3://{BUCKET}/{PREFIX}",
              file=sys.stderr)
        return 2
    client = make_client()
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if BUCKET not in existing:
        client.create_bucket(Bucket=BUCKET)
    store = S3Store(client, BUCKET)
    if next(iter(store.list(PREFIX + "/")), None) is not None:
        print(f"seed: s3://{BUCKET}/{PREFIX}/ already holds objects; left as it is")
        return 0
    seeded = seed_demo(store)
    size = sum(len(data) for data in seeded.originals.values())
    print(f"seed: s3://{BUCKET}/{PREFIX}/: {len(seeded.originals)} segments ({size / 2**20:.1f} MiB of .log), "
          f"{len(seeded.active)} active, corrupt: {seeded.corrupt}, without indexes: {seeded.indexless}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
