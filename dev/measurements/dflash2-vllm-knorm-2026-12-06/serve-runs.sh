# vLLM 0.32 CPU serving of the shipped DFlash drafter (K = 3), as shipped and with each layer's own
# K norm on the context keys; from the repository root (2026-12-06, 2-core AMD EPYC, AVX2 only).
dir=dev/measurements/dflash2-vllm-knorm-2026-12-06
for mode in shipped patch; do
  OMP_NUM_THREADS=1 PYTHONPATH=. .venv-vllm/bin/python $dir/patched_generate.py $mode \
    --target ~/.cache/dflash-studio/smollm2-135m-instruct --drafter assets/drafters/smollm2-135m-instruct-dflash \
    --num-speculative-tokens 3 --prompts assets/prompts/natural.jsonl --num-prompts 8 --max-tokens 128 \
    --threads 1 --eager --out $dir/vllm-serve-dflash-$mode.json
done
