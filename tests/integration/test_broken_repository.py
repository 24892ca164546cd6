"""Broken model repositories: each broken pipeline fails its load with the right status code and
a message naming the file (and the manifest's field), is listed as failed with that error, is
refused by Generate, and leaves nothing behind; the server serves on as it was (catalogue.py's
check after every case).

  component files   truncated (with and without a digest), empty, foreign, a directory, a FIFO,
                    a dangling, looping or outward symbolic link, paths with '..' or absolute
  manifests         empty, with a tab, binary, a list, too large, with aliases, linked from
                    outside, a latent.downscale past its bound, defaults the kind refuses, a
                    directory
  tokenizer files   missing, not JSON, a list, a directory, lines that are not UTF-8, absolute
  pipeline folders  linked from outside the repository

Nothing read outside the repository (SECRET) may reach a client.
"""

import os
import re
import shutil

import pytest

from catalogue import INVALID, NOT_FOUND, PRECONDITION, assert_status
from catalogue import baseline, server_recovers  # noqa: F401 (fixtures)
from conftest import rpc_error

SECRET = "TOPSECRET-4b1d-not-for-clients"  # in a file outside the repository
NOISE = bytes((i * 151 + 7) % 256 for i in range(1024))  # bytes that are no format


def drop_digests(folder):
    """The manifest in `folder` without its components' sha256 lines (older repositories), so a
    damaged file reaches the TorchScript loader instead of the digest check."""
    manifest = folder / "pipeline.yaml"
    lines = manifest.read_text().splitlines()
    manifest.write_text("".join(f"{line}\n" for line in lines if "sha256:" not in line))


def edit_manifest(folder, old, new):
    manifest = folder / "pipeline.yaml"
    text = manifest.read_text()
    assert old in text, f"{old!r} not in {manifest}"
    manifest.write_text(text.replace(old, new))


def drop_weights_entry(folder, component):
    """The manifest without `component`'s weights file: its graph's placeholders stay unbound."""
    manifest = folder / "pipeline.yaml"
    text = manifest.read_text()
    dropped = re.sub(rf"(?m)^    weights:\n      file: {component}\.safetensors\n"
                     r"(      sha256: \w+\n)?", "", text)
    assert dropped != text, f"no weights entry of {component} in {manifest}"
    manifest.write_text(dropped)


def truncate(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


def replace_with_dir(path):
    path.unlink()
    path.mkdir()


def relink(path, target):
    path.unlink()
    os.symlink(target, path)


# (id, how to break a copy of tiny (folder, repository), digests kept, expected code, words the
# message must hold; "{dir}" is the broken pipeline's folder)
BROKEN_FILES = [
    ("component-truncated", lambda d, r: truncate(d / "unet.pt", 100_000), True, INVALID,
     ["{dir}/unet.pt", "SHA-256"]),
    ("component-truncated-no-digest", lambda d, r: truncate(d / "unet.pt", 100_000), False,
     INVALID, ["{dir}/unet.pt", "unet"]),
    ("component-empty", lambda d, r: truncate(d / "unet.pt", 0), False, INVALID,
     ["{dir}/unet.pt", "unet"]),
    # Note [Weights beside the graph] in server/component/weights_file.h.
    ("weights-truncated", lambda d, r: truncate(d / "unet.safetensors", 100_000), True, INVALID,
     ["components.unet.weights.file", "{dir}/unet.safetensors", "SHA-256"]),
    ("weights-truncated-no-digest", lambda d, r: truncate(d / "unet.safetensors", 100_000),
     False, INVALID, ["components.unet.weights.file", "{dir}/unet.safetensors", "cut short"]),
    ("weights-missing", lambda d, r: (d / "unet.safetensors").unlink(), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.weights.file", "does not exist"]),
    ("weights-not-safetensors",
     lambda d, r: (d / "unet.safetensors").write_bytes(NOISE * 4), False, INVALID,
     ["{dir}/unet.safetensors", "not a safetensors file"]),
    ("weights-of-another-component",
     lambda d, r: shutil.copyfile(d / "vae_decoder.safetensors", d / "unet.safetensors"), False,
     INVALID, ["{dir}/unet.safetensors", "holds no tensor", "import the pipeline again"]),
    ("weights-not-in-the-manifest", lambda d, r: drop_weights_entry(d, "unet"), True, INVALID,
     ["{dir}/unet.pt", "is a placeholder", "components.unet.weights"]),
    ("component-zip-header-then-noise",
     lambda d, r: (d / "unet.pt").write_bytes(b"PK\x03\x04" + NOISE * 4), False, INVALID,
     ["{dir}/unet.pt", "unet"]),
    ("text-encoder-truncated", lambda d, r: truncate(d / "text_encoder.pt", 1000), False,
     INVALID, ["{dir}/text_encoder.pt", "text_encoder"]),
    # The last component fails after the first two were loaded: their memory must be freed.
    ("last-component-empty", lambda d, r: truncate(d / "vae_decoder.pt", 0), False, INVALID,
     ["{dir}/vae_decoder.pt", "vae_decoder"]),
    ("component-is-a-directory", lambda d, r: replace_with_dir(d / "unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", "not a regular file"]),
    ("component-is-a-fifo", lambda d, r: ((d / "unet.pt").unlink(), os.mkfifo(d / "unet.pt")),
     True, INVALID, ["{dir}/pipeline.yaml", "components.unet.file", "not a regular file"]),
    ("component-dangling-symlink", lambda d, r: relink(d / "unet.pt", r / "nowhere.pt"), True,
     INVALID, ["{dir}/pipeline.yaml", "components.unet.file", "{dir}/unet.pt"]),
    ("component-symlink-loop", lambda d, r: relink(d / "unet.pt", d / "unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", "{dir}/unet.pt"]),
    ("component-symlink-out-of-repository",
     lambda d, r: relink(d / "unet.pt", r.parent / "outside-unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", "outside the model repository"]),
    ("component-path-with-dotdot",
     lambda d, r: edit_manifest(d, "file: unet.pt", "file: ../tiny/unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", ".."]),
    ("component-path-absolute",
     lambda d, r: edit_manifest(d, "file: unet.pt", f"file: {r}/tiny/unet.pt"), True, INVALID,
     ["{dir}/pipeline.yaml", "components.unet.file", "relative"]),
    ("manifest-empty", lambda d, r: (d / "pipeline.yaml").write_bytes(b""), True, INVALID,
     ["{dir}/pipeline.yaml"]),
    ("manifest-yaml-tab",
     lambda d, r: edit_manifest(d, "\n  unet:\n", "\n\tunet:\n"), True, INVALID,
     ["{dir}/pipeline.yaml", "tab"]),
    ("manifest-binary", lambda d, r: (d / "pipeline.yaml").write_bytes(NOISE), True,
     INVALID, ["{dir}/pipeline.yaml"]),
    ("manifest-a-list", lambda d, r: (d / "pipeline.yaml").write_text("- kind\n- sd\n"), True,
     INVALID, ["{dir}/pipeline.yaml", "mapping"]),
    ("manifest-20-mib",
     lambda d, r: (d / "pipeline.yaml").write_text("kind: sd\n#" + "x" * (20 << 20) + "\n"),
     True, INVALID, ["{dir}/pipeline.yaml", "at most"]),
    ("manifest-alias-bomb", lambda d, r: (d / "pipeline.yaml").write_text(
        'a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]\n' +
        "".join(f"{k}: &{k} [{', '.join([f'*{p}'] * 9)}]\n"
                for p, k in zip("abcdefgh", "bcdefghi")) + "kind: sd\n"),
     True, INVALID, ["{dir}/pipeline.yaml", "alias"]),
    ("latent-downscale-huge",
     lambda d, r: edit_manifest(d, "downscale: 8", "downscale: 1073741824"), True, INVALID,
     ["{dir}/pipeline.yaml", "latent.downscale", "between 1 and 64"]),
    # Sizes that are multiples of latent.downscale (the parser's check) but not of 8, which the
    # kind asks: every request without a size would be refused, so the pipeline is broken.
    ("defaults-not-a-size-of-the-kind",
     lambda d, r: (edit_manifest(d, "downscale: 8", "downscale: 4"),
                   edit_manifest(d, "  width: 64", "  width: 60")), True, INVALID,
     ["{dir}/pipeline.yaml", "defaults", "width must be a positive multiple of 8"]),
    # The manifest itself may not lead out of the repository either, and what it finds there must
    # never reach a client.
    ("manifest-symlink-out-of-repository",
     lambda d, r: relink(d / "pipeline.yaml", r.parent / "secret.txt"), True, INVALID,
     ["{dir}/pipeline.yaml", "outside the model repository"]),
    ("tokenizer-vocab-missing", lambda d, r: (d / "tokenizer" / "vocab.json").unlink(), True,
     INVALID, ["{dir}/pipeline.yaml", "tokenizer.vocab", "{dir}/tokenizer/vocab.json"]),
    ("tokenizer-merges-missing", lambda d, r: (d / "tokenizer" / "merges.txt").unlink(), True,
     INVALID, ["{dir}/pipeline.yaml", "tokenizer.merges", "{dir}/tokenizer/merges.txt"]),
    ("tokenizer-vocab-not-json", lambda d, r: (d / "tokenizer" / "vocab.json").write_text("{"),
     True, INVALID, ["{dir}/tokenizer/vocab.json", "JSON"]),
    ("tokenizer-vocab-a-list", lambda d, r: (d / "tokenizer" / "vocab.json").write_text("[1]"),
     True, INVALID, ["{dir}/tokenizer/vocab.json"]),
    ("tokenizer-vocab-is-a-directory",
     lambda d, r: replace_with_dir(d / "tokenizer" / "vocab.json"), True, INVALID,
     ["{dir}/pipeline.yaml", "tokenizer.vocab", "not a regular file"]),
    # Bytes that are not UTF-8 reach the load's error and ListPipelines: both must stay UTF-8.
    ("tokenizer-merges-line-not-utf8",
     lambda d, r: (d / "tokenizer" / "merges.txt").write_bytes(b"#version: 0.2\n\xff\xfe\xc3(\n"),
     True, INVALID, ["{dir}/tokenizer/merges.txt", "line 2"]),
    ("tokenizer-vocab-absolute",
     lambda d, r: edit_manifest(d, "vocab: tokenizer/vocab.json", f"vocab: {r}/tiny/x.json"),
     True, INVALID, ["{dir}/pipeline.yaml", "tokenizer.vocab", "relative"]),
]


def setup_repository(repository):
    """tiny (loaded), one broken copy of tiny per BROKEN_FILES case, a folder whose manifest is
    a directory, and a pipeline folder linked from outside."""
    shutil.copyfile(repository / "tiny" / "unet.pt", repository.parent / "outside-unet.pt")
    (repository.parent / "secret.txt").write_text(f"{SECRET}\n")
    for name, damage, digests, _, _ in BROKEN_FILES:
        folder = repository / name
        shutil.copytree(repository / "tiny", folder)
        if not digests:
            drop_digests(folder)
        damage(folder, repository)
    (repository / "manifest-is-a-directory").mkdir()
    (repository / "manifest-is-a-directory" / "pipeline.yaml").mkdir()
    shutil.copytree(repository / "tiny", repository.parent / "outside-pipeline")
    os.symlink(repository.parent / "outside-pipeline", repository / "folder-linked-from-outside")


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny",), load="tiny", setup=setup_repository)


@pytest.mark.parametrize("name,code,words", [(c[0], c[3], c[4]) for c in BROKEN_FILES],
                         ids=[c[0] for c in BROKEN_FILES])
def test_broken_files(client, name, code, words):
    """The load fails naming the file (and the manifest's field), the pipeline is listed as
    failed with that error, Generate on it is refused, and nothing of it stays in memory."""
    folder = f"{client.server.repository}/{name}"
    error = rpc_error(client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name=name),
                      timeout=120)
    assert_status(error, code, [w.format(dir=folder) for w in words])
    assert SECRET not in error.details(), "the load's error shows a file outside the repository"
    pipelines = client.pipelines()  # parses: every error in it is UTF-8
    info = pipelines[name]
    assert info.state == client.pb2.PIPELINE_STATE_FAILED
    assert info.error and SECRET not in info.error, info.error
    refused = rpc_error(client.generate, pipeline=name, prompt="x", steps=1, timeout=30)
    assert_status(refused, PRECONDITION, [f"'{name}'"])
    assert pipelines["tiny"].state == client.pb2.PIPELINE_STATE_LOADED


def test_manifest_that_is_a_directory(client):
    """A folder without a regular pipeline.yaml is not a pipeline: not listed, not found."""
    assert "manifest-is-a-directory" not in client.pipelines()
    error = rpc_error(client.models.LoadPipeline,
                      client.pb2.LoadPipelineRequest(name="manifest-is-a-directory"), timeout=30)
    assert_status(error, NOT_FOUND, ["'manifest-is-a-directory'"])


def test_pipeline_folder_linked_from_outside(client):
    """A pipeline folder that is a symbolic link out of the repository: its manifest resolves
    outside it, and the load is refused before the manifest is read."""
    name = "folder-linked-from-outside"
    error = rpc_error(client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name=name),
                      timeout=60)
    assert_status(error, INVALID, [f"{name}/pipeline.yaml", "outside the model repository"])
    assert client.pipelines()[name].state == client.pb2.PIPELINE_STATE_FAILED
