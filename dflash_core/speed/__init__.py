"""Speed and numerics, none of which changes what is decoded: fused Triton kernels and the CPU rows
kernel beside their PyTorch references (`kernels/`), bf16 verification on CPU bitwise as one-token
steps (`batch_invariant.py`), the CPU's few-row linears (`cpu_linear.py`), CUDA graphs
(`cuda_graphs.py`), the steps through torch.compile (`compiled_steps.py`), where a GPU machine
would still decode on the CPU (`device.py`), and the fallbacks' one warning (`fallbacks.py`)."""
