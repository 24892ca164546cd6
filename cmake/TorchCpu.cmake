# LibTorch for a CPU-only build (Note [CPU-only build] in the top CMakeLists.txt): the headers
# and the CPU libraries (libtorch_cpu, libc10) of the PyTorch wheel in QPOOL_TORCH_PREFIX.
# TorchConfig.cmake is not used: for a CUDA wheel it requires the CUDA toolkit, which a CPU-only
# machine lacks. Sets TORCH_LIBRARIES as find_package(Torch) would.
find_library(QPOOL_TORCH_CPU_LIBRARY torch_cpu PATHS ${QPOOL_TORCH_PREFIX}/lib NO_DEFAULT_PATH
             REQUIRED)
find_library(QPOOL_C10_LIBRARY c10 PATHS ${QPOOL_TORCH_PREFIX}/lib NO_DEFAULT_PATH REQUIRED)

add_library(qpool_torch_cpu INTERFACE)
target_include_directories(qpool_torch_cpu SYSTEM INTERFACE
  ${QPOOL_TORCH_PREFIX}/include ${QPOOL_TORCH_PREFIX}/include/torch/csrc/api/include)
target_link_libraries(qpool_torch_cpu INTERFACE ${QPOOL_TORCH_CPU_LIBRARY} ${QPOOL_C10_LIBRARY})
set(TORCH_LIBRARIES qpool_torch_cpu)
message(STATUS "qpool: CPU-only build against LibTorch in ${QPOOL_TORCH_PREFIX}")
