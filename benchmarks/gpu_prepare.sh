#!/usr/bin/env bash
# Makes the two folders benchmarks/gpu_checks.sh needs, here, before the device call (run from the repository root;
# both are git-ignored, and the device call carries them: carry=[".whl", ".gpu"]):
#   .whl/  wheels the device's Python lacks (its torch image has no pydantic or gguf): pydantic and its dependencies,
#          and gguf, for that Python ($DEVICE_PYTHON, default 3.12);
#   .gpu/  SmolLM2-135M-Instruct's config and tokenizer files, no weights (the GPU benchmarks use random weights of
#          its shape: --random-weights --template .gpu).
# Then, on the device: OUT=$OUT bash benchmarks/gpu_checks.sh
set -eu
py=${DEVICE_PYTHON:-3.12}
rm -rf .whl .gpu
pip download -q --no-deps --only-binary :all: --python-version "$py" --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 -d .whl pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
    typing-inspection==0.4.5 gguf==0.19.0
model=$(python -c "from steerkit.models import hf_directory; print(hf_directory('smollm2-135m-instruct'))")
mkdir .gpu
for name in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do
    if [ -f "$model/$name" ]; then cp "$model/$name" .gpu/; fi
done
ls .whl .gpu
