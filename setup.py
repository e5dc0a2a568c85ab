"""t2t_keras: the Transformer of "Attention Is All You Need" in TensorFlow 2 / Keras 3."""

from setuptools import find_packages, setup

setup(
    name="t2t_keras",
    version="0.1.0",
    description="The paper's Transformer and tensor2tensor's training setup in "
                "TensorFlow 2 / Keras 3",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["t2t_keras", "t2t_keras.*"]),
    python_requires=">=3.10",
    install_requires=[
        "tensorflow>=2.21,<2.22",
        # tensorflow-text must match tensorflow's minor version (its kernels link to it).
        "tensorflow-text>=2.21,<2.22",
        "keras>=3.15",
        "tensorflow-datasets>=4.9",
        # tensorflow-datasets 4.9.10 imports importlib_resources when it prepares a
        # dataset (core/dataset_builder.py) but declares it only for Python < 3.9.
        "importlib_resources>=5",
        "sacrebleu>=2.4",
        "absl-py>=2.1",
        "sentencepiece>=0.2",
        "matplotlib>=3.8",  # attention maps and learning curves
        "tensorboard>=2.20",  # tf.summary and the learning-curve tool
    ],
    # tensor2tensor had t2t-trainer and t2t-decoder; `python -m t2t_keras.X` runs the same.
    entry_points={"console_scripts": [
        f"t2t-{name}=t2t_keras.{name}:console_main"
        for name in ("train", "decode", "export", "evaluate", "score")]},
    extras_require={
        # tensorflow-serving-api: tests/serving_test.py runs the gRPC client.
        # ctranslate2: tests/ctranslate2_export_test.py checks the export against it.
        "test": ["pytest>=8", "pytest-timeout", "tensorflow-serving-api>=2.21,<2.22",
                 "ctranslate2>=4.5"],
        "serving": ["tensorflow-serving-api>=2.21,<2.22"],
        # `python -m t2t_keras.export --format=ctranslate2` and tools/ct2_translate.py
        "ctranslate2": ["ctranslate2>=4.5"],
    },
)
