# Fails when gen_wgmma_ops.py no longer writes the committed wgmma_ops.cuh (the ctest
# wgmma_ops_generated). Usage:
#   cmake -DPYTHON=<python3> -DOUT=<scratch file> -P check_wgmma_ops.cmake
set(dir ${CMAKE_CURRENT_LIST_DIR})
execute_process(COMMAND ${PYTHON} ${dir}/gen_wgmma_ops.py OUTPUT_FILE ${OUT} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PYTHON} gen_wgmma_ops.py failed: ${rc}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${OUT} ${dir}/wgmma_ops.cuh
                RESULT_VARIABLE differs)
if(NOT differs EQUAL 0)
  message(FATAL_ERROR "server/quant/sm90/wgmma_ops.cuh is not what gen_wgmma_ops.py writes "
                      "(see ${OUT}). Edit the generator, not the header, and regenerate: "
                      "python3 server/quant/sm90/gen_wgmma_ops.py"
                      " > server/quant/sm90/wgmma_ops.cuh")
endif()
