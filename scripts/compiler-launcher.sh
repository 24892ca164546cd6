# Sourced by the build scripts: sets `launcher` to the CMake arguments that compile through
# scripts/ccache-launch where ccache is installed (scripts/setup.sh installs it), else to none.
# QPOOL_CCACHE=0 turns it off.
launcher=()
if [ "${QPOOL_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null 2>&1; then
  for language in C CXX CUDA; do
    launcher+=("-DCMAKE_${language}_COMPILER_LAUNCHER=$root/scripts/ccache-launch")
  done
fi
