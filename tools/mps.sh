# Sourced by the GPU scripts that run several processes on one GPU: start the CUDA MPS daemon when
# the machine allows it (the processes' small kernels then overlap instead of time-slicing).
mps_start() {
  if nvidia-cuda-mps-control -d 2>/dev/null && python3 -c "import cupy; assert int(cupy.arange(4).sum()) == 6"; then
    echo "MPS: on"
  else
    echo quit | nvidia-cuda-mps-control 2>/dev/null; echo "MPS: off"
  fi
}
mps_stop() { echo quit | nvidia-cuda-mps-control 2>/dev/null || true; }
