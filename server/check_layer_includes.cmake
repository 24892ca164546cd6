# Fails when a source of one layer includes a header of a layer it may not see (the layers of
# ARCHITECTURE.md: api -> pool -> pipeline -> residency/quant -> component -> memory, and the
# torch-free util, config, metrics and tokenizer below). Run by the build for every layer whose
# sources changed (server/CMakeLists.txt, qpool_layer). Usage:
#   cmake -DLAYER=<name> -DSOURCES=<file listing the layer's files> -DOWNERS=<file of
#         "dir=layer" lines> -DALLOWED="<layers it may include>" -DSTAMP=<file> -P this file
file(STRINGS ${SOURCES} files)
file(STRINGS ${OWNERS} owners)
set(errors "")
foreach(file ${files})
  file(STRINGS ${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[\"<]")
  foreach(line ${lines})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*[\"<]([^\">]+)[\">].*" "\\1" header "${line}")
    # Generated protobuf/gRPC code and gRPC itself belong to the gRPC edge only.
    if(header MATCHES "\\.pb\\.h$" OR header MATCHES "^grpcpp/" OR header MATCHES "^grpc/")
      set(owner proto)
    else()
      get_filename_component(dir "${header}" DIRECTORY)
      set(owner "")
      foreach(entry ${owners})
        string(REPLACE "=" ";" pair "${entry}")
        list(GET pair 0 owned_dir)
        list(GET pair 1 owned_by)
        if(dir STREQUAL owned_dir)
          set(owner ${owned_by})
        endif()
      endforeach()
    endif()
    if(owner STREQUAL "" OR owner STREQUAL LAYER)
      continue()
    endif()
    list(FIND ALLOWED ${owner} found)
    if(found EQUAL -1)
      string(APPEND errors "\n  ${file}: #include \"${header}\" (layer ${owner})")
    endif()
  endforeach()
endforeach()
if(NOT errors STREQUAL "")
  message(FATAL_ERROR "layer '${LAYER}' may include only its own headers and those of: "
                      "${ALLOWED} (ARCHITECTURE.md); these point outward:${errors}")
endif()
file(TOUCH ${STAMP})
