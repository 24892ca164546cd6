#include "testing/test_paths.h"

#include <ftw.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace qpool::testing {

std::string SourceDir() { return QPOOL_SOURCE_DIR; }
std::string BinaryDir() { return QPOOL_BINARY_DIR; }

void RemoveTree(const std::string& path) {
  // Not std::filesystem::remove_all: in a process with libtorch 2.11 loaded it resolves to a
  // broken copy exported by libtorch.so and crashes.
  nftw(
      path.c_str(),
      [](const char* file, const struct stat*, int, struct FTW*) { return ::remove(file); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

std::string MakeTempDir(const std::string& tag) {
  static std::atomic<int> counter{0};
  fs::path dir = fs::temp_directory_path() /
                 ("qpool-" + tag + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  RemoveTree(dir.string());
  fs::create_directories(dir);
  return dir.string();
}

void WriteFile(const std::string& path, const std::string& contents) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

std::string TinyRepository() {
  const char* env = std::getenv("QPOOL_TEST_REPOSITORY");
  fs::path repo = env ? fs::path(env) : fs::path(BinaryDir()) / "test-models";
  return fs::exists(repo / "tiny" / "pipeline.yaml") ? repo.string() : "";
}

}  // namespace qpool::testing
