# Sourced by the launch scripts that run on a GPU machine: NVLink SHARP stays off
# (NCCL_NVLS_ENABLE=0), mpirun may run as root, and the CUDA libraries are found.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# gpu_preflight BUILD_DIR: names the GPUs and stops if the trainer lacks a library here.
gpu_preflight() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  if ldd "$1/trainer" | grep "not found"; then
    echo "missing libraries"
    exit 1
  fi
}
