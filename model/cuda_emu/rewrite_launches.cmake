# Rewrites a .cu file for the CUDA emulator (model/cuda_emu/emulator.h):
#   kernel<<<grid, block, shmem, stream>>>(args)
#     -> kernel | ::dgca::cuda::emu::LaunchAt(__FILE__, __LINE__, grid, block, shmem, stream)
#               | ::dgca::cuda::emu::Args(args)
#   extern __shared__ T name[];  ->  T* name = DGCA_EMU_DYNAMIC_SHARED(T);
# Lines are kept (a #line directive names the original file), so compiler
# messages and __FILE__/__LINE__ point at the .cu source.
# Usage: cmake -DIN=file.cu -DOUT=file.cc -P rewrite_launches.cmake
file(READ "${IN}" text)
string(REPLACE "<<<" " | ::dgca::cuda::emu::LaunchAt(__FILE__, __LINE__, " text "${text}")
string(REPLACE ">>>" ") | ::dgca::cuda::emu::Args" text "${text}")
string(REGEX REPLACE "extern __shared__ ([A-Za-z_0-9:]+) ([A-Za-z_0-9]+)\\[\\];"
       "\\1* \\2 = DGCA_EMU_DYNAMIC_SHARED(\\1);" text "${text}")
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
