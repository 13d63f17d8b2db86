"""Build step for the one compiled module: the deep-validation record walker (see its source)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("tiering.kafka._walker", ["tiering/kafka/_walker.c"], extra_compile_args=["-O2", "-std=c99"]),
    ]
)
