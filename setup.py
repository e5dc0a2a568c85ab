"""t2t_keras: the Transformer of "Attention Is All You Need" in TensorFlow 2 / Keras 3."""

from setuptools import find_packages, setup

# tensor2tensor had t2t-trainer and t2t-decoder; `python -m t2t_keras.X` runs the same.
# Command -> the module (below t2t_keras) whose console_script_main it runs: export is a
# package, whose command is its __main__.
ENTRY_POINTS = {"train": "train", "decode": "decode", "export": "export.__main__",
                "evaluate": "evaluate", "score": "score"}
# The tools a user needs after `pip install` (t2t_keras/tools/; `python tools/X.py` in a
# checkout). t2t-run-recipe runs any recipe; the repository's recipes (flags/*.cfg)
# are not in the wheel, so reproducing them needs a checkout (its --help says so).
TOOLS = {
    "average_checkpoints": "t2t-average-checkpoints",
    "beam_translate": "t2t-beam-translate",  # needs the beam extra
    "build_vocab": "t2t-build-vocab",  # the vocabulary half of tensor2tensor's t2t-datagen
    "data_service": "t2t-data-service",  # tf.data service servers for train --data_service
    "ct2_translate": "t2t-ct2-translate",
    "datagen": "t2t-datagen",  # downloads and prepares the recipes' public corpora
    "linearize_trees": "t2t-linearize-trees",
    "plot_learning_curve": "t2t-plot-learning-curve",
    "query_serving": "t2t-query-server",  # tensor2tensor's name for its serving client
    "run_recipe": "t2t-run-recipe",
    "saved_model_cli": "t2t-saved-model-cli",
    "visualize_attention": "t2t-visualize-attention",
}

# The TensorFlow release lines supported: the newest, and the newest that Cloud TPU
# VMs can install (tensorflow-tpu). CI runs the quick lane on the oldest
# (.ci/oldest_tensorflow); BUILD.md names them.
TF_LINES = ("2.20", "2.21")
TF_NEXT = "2.22"
TF_PACKAGES = ("tensorflow", "tensorflow-text", "tensorflow-serving-api")
# The huggingface extra (`--format=huggingface` and its test lane, .ci/huggingface,
# which installs these before the package).
HUGGINGFACE = ["transformers>=5.0", "torch>=2.4", "safetensors>=0.4", "sentencepiece>=0.2"]

setup(
    name="t2t_keras",
    version="0.1.0",
    description="The paper's Transformer and tensor2tensor's training setup in "
                "TensorFlow 2 / Keras 3",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # Apache-2.0, as tensor2tensor. An SPDX identifier; no "License ::" classifier:
    # setuptools >= 77 deprecates those in favour of the SPDX expression.
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 4 - Beta",
        "Intended Audience :: Science/Research",
        "Intended Audience :: Developers",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Operating System :: OS Independent",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Topic :: Text Processing :: Linguistic",
    ],
    packages=find_packages(include=["t2t_keras", "t2t_keras.*"]),
    python_requires=">=3.10",
    # TensorFlow is an extra, not a requirement: a Cloud TPU VM runs `tensorflow-tpu`,
    # a distribution pip does not count as `tensorflow`, so requiring `tensorflow` here
    # would install a second, CPU-only TensorFlow over the TPU build (BUILD.md).
    install_requires=[
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
    entry_points={"console_scripts": [
        f"t2t-{name}=t2t_keras.{module}:console_script_main"
        for name, module in ENTRY_POINTS.items()] + [
        f"{command}=t2t_keras.tools.{module}:console_main"
        for module, command in TOOLS.items()]},
    extras_require={
        # CPU and GPU hosts: TensorFlow of a release line this project supports, and
        # the packages that must match its minor version. tensorflow-text's kernels link
        # against TensorFlow, so each tensorflow-text release pins its own TensorFlow
        # line: the resolver picks a matching pair. tensorflow-serving-api: TF Serving's
        # protos (the XLA export's warm-up requests, t2t-query-server --protocol=grpc).
        "tensorflow": [f"{name}>={TF_LINES[0]},<{TF_NEXT}" for name in TF_PACKAGES],
        # Cloud TPU VMs: the TPU build of the same lines. tensorflow-text and
        # tensorflow-serving-api name the `tensorflow` distribution in their own
        # requirements, so they are installed with --no-deps beside it (BUILD.md).
        "tpu": [f"tensorflow-tpu>={TF_LINES[0]},<{TF_NEXT}"],
        # pytest-xdist: README's test command runs the files on 2 processes; ruff:
        # tests/lint_test.py; ctranslate2: tests/ctranslate2_export_test.py checks the
        # export against it. No TensorFlow here: the tests run on whichever line the
        # environment has (CI runs the quick lane on the oldest line too).
        "test": ["pytest>=8", "pytest-timeout", "pytest-xdist>=3.8", "ruff>=0.6",
                 "ctranslate2>=4.5"],
        # `python -m t2t_keras.export --format=ctranslate2` and t2t-ct2-translate
        "ctranslate2": ["ctranslate2>=4.5"],
        # `python -m t2t_keras.export --format=huggingface` and its test
        # (tests/huggingface_export_test.py, CI's lane .ci/huggingface): PyTorch weights
        # in safetensors that transformers' MarianMT / Pegasus load. Install torch first
        # (`pip install torch`, or its CPU build) so pip does not pick a CUDA build.
        "huggingface": HUGGINGFACE,
        # `python -m t2t_keras.tools.beam_translate`: the SavedModel over files with
        # Apache Beam's RunInference (DirectRunner here; Dataflow needs
        # apache-beam[gcp]). An extra of its own: Beam is large and pins protobuf and
        # numpy ranges of its own (2.77: protobuf < 7 and numpy < 2.5, within
        # TensorFlow 2.21's ranges: pip co-installs them; CI's .ci/beam checks it).
        "beam": ["apache-beam>=2.60"],
    },
)
