// ModelRepository: the directory of pipeline folders that qpool serves (docs/model-repository.md).
// Clients name pipelines only; this is where a name becomes a folder, after validation.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/manifest.h"
#include "util/status.h"

namespace qpool {

// OK for a valid client-supplied pipeline name: 1..64 characters from [A-Za-z0-9._-], not starting
// with '.'. Anything else ("../x", "/etc/passwd", "a/b", "") is InvalidArgument saying what a valid
// name is, so no client string can reach outside the repository.
Status ValidatePipelineName(const std::string& name);

// Where `path` resolves to with every symbolic link followed, and whether that lies inside `root`
// (resolved the same way): Note [Files stay in the repository] in config/manifest_parser.cpp.
// InvalidArgument with the system's reason when either cannot be resolved.
struct ResolvedPath {
  std::string real;
  bool inside = false;
};
StatusOr<ResolvedPath> ResolveWithin(const std::string& path, const std::string& root);

// Note [Manifest cache]
// ListPipelines reads every manifest of the repository, and clients list often. A parsed manifest
// is kept with the identity of its pipeline.yaml (device, inode, size, modification and change
// times) and reused while the file keeps that identity and every file it names (components,
// tokenizers) is still there; an edit, a replacement (rename over it) or a removed component file
// makes the next call parse again. Only valid manifests are kept: a broken one is parsed on every
// call (parsing is bounded: kMaxManifestBytes, no aliases), so fixing a file it names is seen at
// once.
//
// Thread-safety: every method may be called from any thread; copies share one cache. The folder
// is re-read on each call, so pipelines added or removed on disk are seen at once.
class ModelRepository {
 public:
  // Opens the repository at `root` (made absolute), whose manifests may name the kinds of
  // `kinds`. NotFound if it does not exist, InvalidArgument if it is not a directory.
  static StatusOr<ModelRepository> Open(const std::string& root, KindCatalog kinds);

  // Absolute, normalized path of the repository.
  const std::string& root() const { return root_; }

  // Sorted names of the sub-folders that hold a pipeline.yaml; folders with invalid names are
  // skipped.
  std::vector<std::string> ListNames() const;

  // The manifest of pipeline `name`: InvalidArgument for an invalid name, NotFound "no pipeline
  // named 'x' in model repository <root>" when the folder or its pipeline.yaml is missing, else
  // qpool::LoadManifest of the folder with the repository's kinds (Note [Manifest cache]).
  StatusOr<PipelineManifest> LoadManifest(const std::string& name) const;

  // Manifests parsed since Open (cache misses), for tests and diagnostics.
  uint64_t manifests_parsed() const;

 private:
  struct Cache;
  ModelRepository(std::string root, KindCatalog kinds);

  std::string root_;
  KindCatalog kinds_;
  std::shared_ptr<Cache> cache_;
};

}  // namespace qpool
