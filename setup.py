"""Build step for the compiled modules: the deep-validation record walker, the record layer of re-batching, key
compaction's key map and filter, and the zstd proof (see their sources)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("tiering.kafka._walker", ["tiering/kafka/_walker.c"], extra_compile_args=["-O2", "-std=c99"]),
        Extension("tiering.kafka._records", ["tiering/kafka/_records.c"], depends=["tiering/kafka/_records.h"],
                  extra_compile_args=["-O2", "-std=c99"]),
        Extension("tiering.kafka._keymap", ["tiering/kafka/_keymap.c"], depends=["tiering/kafka/_records.h"],
                  extra_compile_args=["-O2", "-std=c99"]),
        Extension("tiering.kafka._proof", ["tiering/kafka/_proof.c"], extra_compile_args=["-O2", "-std=c99"]),
    ]
)
